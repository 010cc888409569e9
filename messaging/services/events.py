"""Live events: published by services after commit, to per-audience channel-layer groups.

Groups: `operators` (every console), `session.<id>` (that agent's sockets), `team.<id>`.
Sockets are a fast path; the database stays the truth, so a lost event loses nothing and a
reconnecting client refetches by id.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

OPERATORS_GROUP = "operators"


def session_group(session_id: object) -> str:
    return f"session.{session_id}"


def team_group(team_id: object) -> str:
    return f"team.{team_id}"


def announce(
    kind: str,
    data: dict[str, Any],
    *,
    sessions: Iterable[object] = (),
    teams: Iterable[object] = (),
    operators: bool = True,
) -> None:
    """Send `{kind, data}` to the named groups once the current transaction commits."""
    groups = [session_group(s) for s in sessions] + [team_group(t) for t in teams]
    if operators:
        groups.append(OPERATORS_GROUP)
    event = {"type": "hub.event", "kind": kind, "data": data}
    transaction.on_commit(lambda: _send(groups, event))


def _send(groups: list[str], event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group in groups:
        try:
            async_to_sync(layer.group_send)(group, event)
        except Exception:  # a push is best effort; the database already has the change
            log.warning("could not push %s to %s", event["kind"], group, exc_info=True)
