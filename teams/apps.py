from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "teams"
    verbose_name = "Teams"

    def ready(self) -> None:
        from messaging.jobs import PERIODIC_JOBS, PeriodicJob

        ours = [
            PeriodicJob("teams.tasks.sweep_teams", 5),
            PeriodicJob("teams.tasks.purge_ended_teams", 3600),
        ]
        known = {job.task_name for job in PERIODIC_JOBS}
        PERIODIC_JOBS.extend(job for job in ours if job.task_name not in known)
