from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"

    def ready(self) -> None:
        # Bind @shared_task to Switchboard's Celery app in every Django process (web, worker, beat).
        from console.celery import app  # noqa: F401
