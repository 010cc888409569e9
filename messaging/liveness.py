"""Whether a session is alive: the one rule for `dead`, which every surface reads from here.

A session says it is busy or idle; if the hub has not heard from it (a heartbeat, a request) for
longer than SWITCHBOARD_DEAD_AFTER_SECONDS, it is `dead`, told apart from `idle` (its turn ended)
and from stopped or exited (it said so). The console shows this verdict as the server gave it; a
page refreshes it from the server rather than deciding it again in the browser.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from messaging.models import AgentSession, SessionStatus

LIVE = (SessionStatus.BUSY, SessionStatus.IDLE)
DEAD = "dead"


def dead_before(now: datetime | None = None) -> datetime:
    """A live session last seen before this instant is dead."""
    return (now or timezone.now()) - timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS)


def session_is_dead(session: AgentSession, *, now: datetime | None = None) -> bool:
    """True when a session that claims to be running has not been heard from within the timeout."""
    if session.status not in LIVE or session.last_seen is None:
        return False
    return session.last_seen < dead_before(now)


def session_liveness(session: AgentSession, *, now: datetime | None = None) -> str:
    """`dead` for a silent running session; otherwise its status (busy, idle, stopped, ...)."""
    return DEAD if session_is_dead(session, now=now) else str(session.status)


def dead_sessions_q(now: datetime | None = None) -> Q:
    """The same rule as a query filter on AgentSession, for counting and listing dead sessions."""
    return Q(status__in=LIVE, last_seen__lt=dead_before(now))


def liveness_fields(session: AgentSession, *, now: Any = None) -> dict[str, Any]:
    """The fields `session_summary` adds: `dead` and `liveness`."""
    return {"dead": session_is_dead(session, now=now), "liveness": session_liveness(session, now=now)}
