"""Switchboard's Django project package and operator console.

The Celery app is loaded when Django starts (ConsoleConfig.ready) rather than on import, so the
hub commands that never use it (`switchboard web` choosing its event loop) do not pay for importing Celery.
"""

from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from console.celery import app

        return app
    raise AttributeError(name)
