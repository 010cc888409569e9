"""Switchboard's Django project: settings, URLs, the ASGI entry point, the REST API's assembly and
its handler, the Celery app, the SQLite backend, the server commands and their tuning, logging,
health checks and the guard in front of every request. The apps (`messaging`, `teams`,
`federation`, `alerts`, `console`) hold what the hub does; this package puts them together.

The Celery app is loaded when Django starts (HubConfig.ready) rather than on import, so commands
that never use it (`switchboard web` choosing its event loop) do not pay for importing Celery.
"""

from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from hub.celery import app

        return app
    raise AttributeError(name)
