from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"
    verbose_name = "Operator alerts"

    def ready(self) -> None:
        from django.conf import settings

        from alerts.services import on_escalated_holds
        from messaging.jobs import PERIODIC_JOBS, PeriodicJob
        from messaging.services.holds import escalated_holds_created

        escalated_holds_created.connect(on_escalated_holds, dispatch_uid="alerts.escalated_holds")
        # Only a hub that posts alerts looks for what to post.
        if settings.SWITCHBOARD_ALERT_WEBHOOK_URL:
            job = PeriodicJob("alerts.tasks.alerts_run", settings.SWITCHBOARD_ALERT_SECONDS)
            if job.task_name not in {j.task_name for j in PERIODIC_JOBS}:
                PERIODIC_JOBS.append(job)
