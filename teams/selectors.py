"""Read-only questions other apps ask about teams."""

from __future__ import annotations

from messaging.models import AgentSession


def lead_session_of(session: AgentSession) -> AgentSession | None:
    """The lead of the team `session` is a teammate in, or None when it is in no team."""
    return None
