"""Live events: published by services after commit, to per-audience channel-layer groups.

Groups: `operators` (every console), `session.<id>` (that agent's sockets), `team.<id>`.
Sockets are a fast path; the database stays the truth, so a lost event loses nothing and a
reconnecting client refetches by id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
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
    groups, event = _event(kind, data, sessions=sessions, teams=teams, operators=operators)
    transaction.on_commit(lambda: _send(groups, event))


def announce_many(
    items: list[tuple[str, dict[str, Any], Iterable[object]]], *, operators: bool = True
) -> None:
    """`announce` for many changes at once (`(kind, data, sessions)` each), published together after
    the commit: one hand-off to the publisher for the lot instead of one per change."""
    batch = [_event(kind, data, sessions=sessions, operators=operators) for kind, data, sessions in items]
    if batch:
        transaction.on_commit(lambda: _send_many(batch))


def _event(
    kind: str,
    data: dict[str, Any],
    *,
    sessions: Iterable[object] = (),
    teams: Iterable[object] = (),
    operators: bool = True,
) -> tuple[list[str], dict[str, Any]]:
    groups = [session_group(s) for s in sessions] + [team_group(t) for t in teams]
    if operators:
        groups.append(OPERATORS_GROUP)
    return groups, {"type": "hub.event", "kind": kind, "data": data}


def _send(groups: list[str], event: dict[str, Any]) -> None:
    _send_many([(groups, event)])


def _send_many(batch: list[tuple[list[str], dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        _run(layer, _publish(layer, batch))
    except Exception:  # a push is best effort; the database already has the change
        log.warning("could not push %d events", len(batch), exc_info=True)


async def _publish(layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
    # A batch holds one event per change (`announce_many`), so its events need no order among
    # themselves: send 16 at a time (within the layer's connection pool); batches stay in commit order.
    for start in range(0, len(batch), 16):
        sends = [(g, event) for groups, event in batch[start : start + 16] for g in groups]
        results = await asyncio.gather(*(layer.group_send(g, e) for g, e in sends), return_exceptions=True)
        for (group, event), result in zip(sends, results, strict=True):
            if isinstance(result, Exception):
                log.warning("could not push %s to %s: %r", event["kind"], group, result)


def _run(layer: Any, coro: Any) -> None:
    """Wait for `coro` on this process's publisher loop when the layer is Redis: one long-lived loop
    and connection pool. (`async_to_sync` in a thread without a loop — a Celery worker, a sweep —
    makes a new event loop, and so a new Redis connection, for every call.) In-memory layers belong
    to the server's loop, so they keep `async_to_sync`."""
    if not type(layer).__module__.startswith("channels_redis"):

        async def _await() -> None:
            await coro

        async_to_sync(_await)()
        return
    asyncio.run_coroutine_threadsafe(coro, _publisher_loop()).result(timeout=_PUBLISH_TIMEOUT)


_PUBLISH_TIMEOUT = 10.0
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _publisher_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():  # a forked worker child starts its own
            _loop = asyncio.new_event_loop()
            _loop_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="switchboard-events", daemon=True).start()
        return _loop
