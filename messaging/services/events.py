"""Live events: published by services after commit, to per-audience channel-layer groups.

Groups: `operators` (every console), `session.<id>` (that agent's sockets), `team.<id>`, and
those a higher app names (`console`: one operator's consoles).
Sockets are a fast path; the database stays the truth, so a lost event loses nothing and a
reconnecting client refetches by id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings
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
    groups: Iterable[str] = (),
) -> None:
    """Send `{kind, data}` to the named groups once the current transaction commits (`groups`:
    groups a higher app names itself, such as one operator's consoles)."""
    named, event = _event(kind, data, sessions=sessions, teams=teams, operators=operators)
    named += groups
    transaction.on_commit(lambda: _send(named, event))


class Announcement(NamedTuple):
    """One change for `announce_many`: its kind and data, the sessions told, and whether the
    console is."""

    kind: str
    data: dict[str, Any]
    sessions: Iterable[object] = ()
    operators: bool = True


def announce_many(items: Iterable[Announcement]) -> None:
    """`announce` for many changes at once, published together after the commit: one hand-off to
    the publisher for the lot, and one channel message per group (a `hub.events` holding that
    group's events in order; consumers take each as if it came alone) instead of one per change
    and group — a batch of 100 sends is 2 Redis sends, not 200.

    One hand-off also keeps the order among groups: a change's events all go out before anything
    that one of them leads to (a push that the recipient answers with a pull, whose `delivered`
    receipt must not reach the sender before the sender's own `message.sent`)."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        groups, event = _event(item.kind, item.data, sessions=item.sessions, operators=item.operators)
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
        target = _pubsub_target(layer)
        if target is not None:
            _publisher(target).put(layer, batch)
        else:  # in-memory layers belong to the server's loop
            _publish_on_server_loop(layer, batch)
    except Exception:  # a push is best effort; the database already has the change
        log.warning("could not push %d events", len(batch), exc_info=True)


def _publish_on_server_loop(layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
    """Hand the batch to the server's event loop (an in-memory layer lives there). A request's
    thread does not wait for it: the loop is busy serving, and a wait there held the request (and
    its thread) for as long as the loop took to get round to it. Code with no server loop behind
    its thread (a task on the embedded pool, a command, a test) publishes and waits as before.
    Batches start in the order they are handed over, so events keep commit order.

    A thread whose server loop has stopped but is not closed (the hub is shutting down) drops the
    batch: no socket of this process is left to tell, and `async_to_sync` would hand the work to
    that loop and wait for it forever, so the process, which joins its request threads on exit,
    would never exit."""
    # asgiref notes the loop behind each `sync_to_async` call on its thread and never clears it,
    # so a thread outside such a call may find a loop that has since stopped.
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    behind = getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) == os.getpid()
    if loop is not None and behind and not loop.is_running() and not loop.is_closed():
        log.debug("the server is stopping: %d live events not pushed", len(batch))
        return
    if loop is None or not behind or not loop.is_running():
        async_to_sync(_publish)(layer, batch)
        return
    loop.call_soon_threadsafe(_publish_started, layer, batch)


def _publish_started(layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
    task = asyncio.ensure_future(_publish(layer, batch))
    _publishing.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(_publishing.discard)


_publishing: set[asyncio.Future[None]] = set()


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


@dataclass(frozen=True)
class _PubSubTarget:
    """Where a Redis pub/sub channel layer with one Redis server publishes a group's messages."""

    address: str
    prefix: str

    def group_channel(self, group: str) -> str:
        # channels_redis.pubsub names a group's Redis channel so (RedisPubSubLoopLayer
        # ._get_group_channel_name); a test sends through here and receives through the layer.
        return f"{self.prefix}__group__{group}"


def _pubsub_target(layer: Any) -> _PubSubTarget | None:
    """The one Redis server and prefix of the settings' pub/sub layer, or None for any other layer
    (in-memory, or one spread over several servers), which goes through the layer's own group_send."""
    if not isinstance(layer, RedisPubSubChannelLayer):
        return None
    config = settings.CHANNEL_LAYERS.get("default", {}).get("CONFIG", {})
    hosts = config.get("hosts") or []
    if len(hosts) != 1 or not isinstance(hosts[0], dict) or "address" not in hosts[0]:
        return None
    return _PubSubTarget(address=hosts[0]["address"], prefix=config.get("prefix", "asgi"))


class _Publisher:
    """This process's sender of live events to Redis. A batch handed over while nothing else is
    waiting or being published goes out at once, on the caller's thread, in one round trip: that
    is the common case, a send now and then, whose push then never waits for another thread to
    get the interpreter lock from the request still answering. Batches handed over meanwhile wait
    for one thread, which publishes everything waiting in one pipelined round trip, so under load
    many sends' events share a round trip and requests do not wait for Redis. Rounds never overlap, so events go out in the order
    they were handed over (commit order).

    A caller waits at most INLINE_TIMEOUT for Redis. A batch Redis did not take then goes to the
    thread (whose longer timeout is its second chance, and whose round may come after batches
    queued meanwhile), and the thread publishes everything until one of its rounds goes out, so a
    hung Redis holds up one request, not each. The database already has every change, so events
    lost with Redis or the process lose nothing (a socket that reconnects pulls what is queued)."""

    MAX_QUEUED = 50_000  # batches; beyond that (Redis hung) new ones are dropped, with a warning
    MAX_PER_ROUND = 500  # batches published in one pipeline
    INLINE_TIMEOUT = 0.25  # seconds a caller's thread waits for Redis at most

    def __init__(self, target: _PubSubTarget) -> None:
        import redis

        self.pid = os.getpid()
        self.target = target
        self.dropped, self.warned_at = 0, -1e9
        self.queue: queue.SimpleQueue[list[tuple[str, bytes]]] = queue.SimpleQueue()
        # A hung Redis must not stall the thread for long: it gives up on a round after 10 s.
        self.redis = redis.Redis.from_url(target.address, socket_timeout=10, socket_connect_timeout=5)
        self.inline_redis = redis.Redis.from_url(
            target.address, socket_timeout=self.INLINE_TIMEOUT, socket_connect_timeout=self.INLINE_TIMEOUT
        )
        self._lock = threading.Lock()  # guards the two fields below
        self._unpublished = 0  # batches handed over and not yet published (queued or in a round)
        self._inline = True  # off from a failed round on a caller's thread to the thread's next good one
        self._publishing = threading.Lock()  # held for each round: one at a time, in order
        threading.Thread(target=self._run, name="switchboard-events", daemon=True).start()

    def put(self, layer: Any, batch: list[tuple[list[str], dict[str, Any]]]) -> None:
        """Publish a batch now if nothing is ahead of it, else queue it for the thread. Its events
        are serialized here, so an event that cannot be raises to the caller (which logs it) and
        spoils no other round."""
        if self.queue.qsize() >= self.MAX_QUEUED:
            self.dropped += len(batch)
            if time.monotonic() - self.warned_at >= 5:  # one line every 5 s, not one per event
                log.warning(
                    "live events are backing up (Redis slow or down); %d dropped so far", self.dropped
                )
                self.warned_at = time.monotonic()
            return
        publishes = []
        for groups, event in batch:
            payload = layer.serialize(event)
            publishes.extend((self.target.group_channel(group), payload) for group in groups)
        with self._lock:
            now = self._inline and self._unpublished == 0
            self._unpublished += 1
            if now:
                # Nothing is queued or in a round, so this never waits; taken before the lock is
                # let go, so a batch queued behind this one cannot go out first.
                self._publishing.acquire()
            else:
                self.queue.put(publishes)
        if not now:
            return
        published = False
        try:
            self._send_round([publishes], self.inline_redis)
            published = True
        except Exception as exc:
            log.warning("Redis did not take live events at once (%r); the events thread tries again", exc)
        finally:
            self._publishing.release()
            with self._lock:
                if published:
                    self._unpublished -= 1
                else:  # still unpublished: the thread tries, and takes every batch until it succeeds
                    self._inline = False
                    self.queue.put(publishes)

    def _run(self) -> None:
        while True:
            waiting = [self.queue.get()]
            while len(waiting) < self.MAX_PER_ROUND:
                try:
                    waiting.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            with self._publishing:
                published = self.publish_round(waiting)
            with self._lock:
                self._unpublished -= len(waiting)
                self._inline = self._inline or published

    def publish_round(self, waiting: list[list[tuple[str, bytes]]]) -> bool:
        """The thread's round: PUBLISH the waiting batches; False if Redis did not take them (they
        are lost, and logged)."""
        try:
            self._send_round(waiting, self.redis)
        except Exception:  # Redis down or hung: these are lost (the database has them); go on
            log.warning("could not push %d events", sum(map(len, waiting)), exc_info=True)
            return False
        return True

    @staticmethod
    def _send_round(waiting: list[list[tuple[str, bytes]]], client: Any) -> None:
        """PUBLISH the waiting batches' messages, in order, in one round trip."""
        pipe = client.pipeline(transaction=False)
        for publishes in waiting:
            for channel, payload in publishes:
                pipe.publish(channel, payload)
        pipe.execute()


_publisher_instance: _Publisher | None = None
_publisher_lock = threading.Lock()


def _publisher(target: _PubSubTarget) -> _Publisher:
    global _publisher_instance
    with _publisher_lock:
        instance = _publisher_instance
        # A forked child starts its own; so does a test that points the layer at another Redis.
        if instance is None or instance.pid != os.getpid() or instance.target != target:
            instance = _publisher_instance = _Publisher(target)
        return instance
