from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "teams"
    verbose_name = "Teams"

    def ready(self) -> None:
        from django.conf import settings

        from messaging.jobs import PERIODIC_JOBS, PeriodicJob

        # Expire requests, lapse subscriptions, retry gate checks: as often as held deliveries expire.
        ours = [
            PeriodicJob("teams.tasks.sweep_teams", settings.SWITCHBOARD_SWEEP_SECONDS),
            PeriodicJob("teams.tasks.purge_ended_teams", 3600),
        ]
        known = {job.task_name for job in PERIODIC_JOBS}
        PERIODIC_JOBS.extend(job for job in ours if job.task_name not in known)

        from teams.plugins import teams_plug_in

        teams_plug_in()
