from django.apps import AppConfig
from django.conf import settings


class HubConfig(AppConfig):
    name = "hub"
    verbose_name = "Switchboard hub (the Django project)"

    def ready(self) -> None:
        # Bind @shared_task to Switchboard's Celery app in every Django process (web, worker, beat).
        from hub.celery import app  # noqa: F401

        _skip_closing_in_process_caches()


def _skip_closing_in_process_caches() -> None:
    """Django closes every cache after each request, for caches that hold connections. The hub
    uses no cache but Django's in-process default, which has nothing to close, and the check costs
    a context-local lookup per cache on every request; skip it then."""
    from django.core import signals
    from django.core.cache import close_caches

    backends = {c.get("BACKEND", "") for c in settings.CACHES.values()}
    if backends <= {"django.core.cache.backends.locmem.LocMemCache"}:
        signals.request_finished.disconnect(close_caches)
