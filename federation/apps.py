from __future__ import annotations

from django.apps import AppConfig

from messaging.jobs import PeriodicJob

FILES_CLEANUP_SECONDS = 600  # unused files are removed within this long of their grace period's end


class FederationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "federation"
    verbose_name = "Federation: hubs reaching each other's agents"

    def ready(self) -> None:
        from federation.plugins import federation_plug_in

        federation_plug_in()

        from messaging.jobs import PERIODIC_JOBS

        names = {job.task_name for job in PERIODIC_JOBS}
        PERIODIC_JOBS.extend(job for job in federation_jobs() if job.task_name not in names)

        from federation.metrics import forward_figures
        from messaging.metrics import database_collector_add

        database_collector_add(forward_figures)

        from federation.services.files import files_of_purged_messages_drop
        from messaging.services.retention import messages_purged

        messages_purged.connect(files_of_purged_messages_drop, dispatch_uid="federation.files")

        from federation.services.keys import answer_refused_record
        from federation.transport import answer_refused

        answer_refused.connect(answer_refused_record, dispatch_uid="federation.answer_refused")


def federation_jobs() -> list[PeriodicJob]:
    """Federation's periodic jobs, as the settings of this process (beat's, or `serve`'s) call for:
    a hub pulls from a relay only when SWITCHBOARD_RELAY_URL names one, and only a relay cleans
    up after its pulls. Forwards, receipts and the cleanup of unused files run always: peers,
    inbound messages and uploads come and go while the hub runs."""
    from django.conf import settings

    every = settings.SWITCHBOARD_FEDERATION_POLL_SECONDS
    relay = settings.SWITCHBOARD_ROLE == "relay"
    jobs = [
        PeriodicJob("federation.tasks.retry_forwards", every),
        PeriodicJob("federation.tasks.send_receipts", every),
        PeriodicJob("federation.tasks.registry_refresh", 60),
        PeriodicJob("federation.tasks.nonces_prune", 300),
        PeriodicJob("federation.tasks.files_cleanup", FILES_CLEANUP_SECONDS),
    ]
    if settings.SWITCHBOARD_RELAY_URL and not relay:
        jobs.append(PeriodicJob("federation.tasks.relay_pull", every))
    if relay:
        jobs.append(PeriodicJob("federation.tasks.relay_cleanup", 300))
    jobs.append(PeriodicJob("federation.tasks.remote_sessions_prune", 3600))
    return jobs
