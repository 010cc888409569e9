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
    the commit: one hand-off to the publisher for the lot, and one channel message per group (a
    `hub.events` holding that group's events in order; consumers take each as if it came alone)
    instead of one per change and group — a batch of 100 sends is 2 Redis sends, not 200."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for kind, data, sessions in items:
        groups, event = _event(kind, data, sessions=sessions, operators=operators)
        for group in groups:
            by_group.setdefault(group, []).append(event)
    batch = [
        ([group], events[0] if len(events) == 1 else {"type": "hub.events", "events": events})
        for group, events in by_group.items()
    ]
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
        if type(layer).__module__.startswith("channels_redis"):
            _publisher().put(layer, batch)
        else:  # in-memory layers belong to the server's loop
            async_to_sync(_publish)(layer, batch)
    except Exception:  # a push is best effort; the database already has the change
        log.warning("could not push %d events", len(batch), exc_info=True)


async def _publish(layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
    # A batch holds one channel message per group (`announce_many`), so its messages need no order
    # among themselves: send 16 at a time (within the layer's connection pool); batches stay in
    # commit order.
    for start in range(0, len(batch), 16):
        sends = [(g, event) for groups, event in batch[start : start + 16] for g in groups]
        results = await asyncio.gather(*(layer.group_send(g, e) for g, e in sends), return_exceptions=True)
        for (group, event), result in zip(sends, results, strict=True):
            if isinstance(result, Exception):
                # A bundle (`hub.events`) has no kind of its own.
                log.warning("could not push %s to %s: %r", event.get("kind", event["type"]), group, result)


class _Publisher:
    """This process's sender of live events to Redis: a thread with one long-lived event loop (so
    one connection pool; `async_to_sync` in a thread without a loop — a Celery worker, a sweep —
    makes a new loop and a new Redis connection per call) and one task that sends queued batches
    in commit order. A request or a task hands its events over and goes on without waiting for
    Redis; the database already has the change, so an event lost with the process loses nothing."""

    MAX_QUEUED = 50_000  # batches; beyond that (Redis hung) new ones are dropped, with a warning

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.dropped, self.warned_at = 0, -1e9
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[tuple[Any, list[tuple[list[str], dict[str, Any]]]]] | None = None
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="switchboard-events", daemon=True).start()
        ready.wait(5)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.queue = asyncio.Queue()
        self.loop.create_task(self._drain())
        ready.set()
        self.loop.run_forever()

    async def _drain(self) -> None:
        assert self.queue is not None
        while True:
            layer, batch = await self.queue.get()
            try:
                await asyncio.wait_for(_publish(layer, batch), timeout=10)
            except Exception:
                log.warning("could not push %d events", len(batch), exc_info=True)

    def put(self, layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
        self.loop.call_soon_threadsafe(self._enqueue, layer, batch)

    def _enqueue(self, layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
        assert self.queue is not None
        if self.queue.qsize() >= self.MAX_QUEUED:
            self.dropped += len(batch)
            if self.loop.time() - self.warned_at >= 5:  # one line every 5 s, not one per event
                log.warning(
                    "live events are backing up (Redis slow or down); %d dropped so far", self.dropped
                )
                self.warned_at = self.loop.time()
            return
        self.queue.put_nowait((layer, batch))


_publisher_instance: _Publisher | None = None
_publisher_lock = threading.Lock()


def _publisher() -> _Publisher:
    global _publisher_instance
    with _publisher_lock:
        if (
            _publisher_instance is None or _publisher_instance.pid != os.getpid()
        ):  # a forked child starts its own
            _publisher_instance = _Publisher()
        return _publisher_instance
