"""A hub's history, made in bulk for tests and benchmarks: what a hub that has run for a while keeps."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from django.utils import timezone

from messaging.models import AgentSession, SessionStatus
from messaging.names import normalize_name


def exited_sessions_made(names: Iterable[str]) -> list[AgentSession]:
    """One exited session per name, written in one statement: the sessions a hub keeps after
    their agents have gone (a folder's sessions all take the folder's name)."""
    now = timezone.now()
    return AgentSession.objects.bulk_create(
        AgentSession(
            name=name,
            name_key=normalize_name(name),
            ref=secrets.token_hex(6),
            status=SessionStatus.EXITED,
            token_hash=secrets.token_hex(32),
            last_seen=now,
            status_changed_at=now,
        )
        for name in names
    )
