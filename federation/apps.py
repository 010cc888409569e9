from django.apps import AppConfig


class FederationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "federation"
    verbose_name = "Federation: hubs reaching each other's agents"

    def ready(self) -> None:
        from django.conf import settings

        from messaging.jobs import PERIODIC_JOBS, PeriodicJob

        every = settings.SWITCHBOARD_FEDERATION_POLL_SECONDS
        names = {job.task_name for job in PERIODIC_JOBS}
        for job in (
            PeriodicJob("federation.tasks.retry_forwards", every),
            PeriodicJob("federation.tasks.send_receipts", every),
            PeriodicJob("federation.tasks.relay_pull", every),
            PeriodicJob("federation.tasks.registry_refresh", 60),
            PeriodicJob("federation.tasks.relay_cleanup", 300),
        ):
            if job.task_name not in names:
                PERIODIC_JOBS.append(job)
