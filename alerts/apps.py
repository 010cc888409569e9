from __future__ import annotations

from django.apps import AppConfig

from messaging.jobs import PeriodicJob


class AlertsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"
    verbose_name = "Operator alerts"

    def ready(self) -> None:
        from alerts.services import on_escalated_holds
        from messaging.jobs import PERIODIC_JOBS
        from messaging.services.holds import escalated_holds_created

        escalated_holds_created.connect(on_escalated_holds, dispatch_uid="alerts.escalated_holds")
        names = {job.task_name for job in PERIODIC_JOBS}
        PERIODIC_JOBS.extend(job for job in alerts_jobs() if job.task_name not in names)


def alerts_jobs() -> list[PeriodicJob]:
    """The alerts job, on a hub that posts alerts (SWITCHBOARD_ALERT_WEBHOOK_URL set) only."""
    from django.conf import settings

    if not settings.SWITCHBOARD_ALERT_WEBHOOK_URL:
        return []
    return [PeriodicJob("alerts.tasks.alerts_run", settings.SWITCHBOARD_ALERT_SECONDS)]
