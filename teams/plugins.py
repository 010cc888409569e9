"""What `teams` plugs into `messaging` (see `messaging.plugins`), registered by `TeamsConfig.ready`:
whom the address `lead` means, the observers' send guard, and what a status change causes for a
team (the lead hears that a teammate went idle, subscriptions fire, an exited member leaves)."""

from __future__ import annotations

from typing import Any

from messaging.models import AgentSession
from messaging.plugins import PLUGINS, session_status_changed
from teams.models import Observer
from teams.selectors import lead_session_of


class ObserverGuard:
    """Observers send only observer reports to their target and receive nothing."""

    def __init__(self) -> None:
        self.restricted_sql = f"EXISTS (SELECT 1 FROM {Observer._meta.db_table} WHERE session_id = %s)"

    def check(self, *, sender: AgentSession, recipient: AgentSession, kind: str) -> str | None:
        from teams.services.observers import observer_check_send

        return observer_check_send(sender=sender, recipient=recipient, kind=kind)


def _status_changed(
    *, session: AgentSession, previous: str, final_answer: str | None, actor: Any, **_: object
) -> None:
    from teams.services.liveness import on_session_status

    on_session_status(session=session, previous=previous, final_answer=final_answer, actor=actor)


def teams_plug_in() -> None:
    """Register teams on messaging's plug-in points (once per process)."""
    PLUGINS.send_guard = ObserverGuard()
    PLUGINS.lead_of = lead_session_of  # whom the address `lead` means for a teammate
    session_status_changed.connect(_status_changed, dispatch_uid="teams.status")
