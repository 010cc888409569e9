"""Waiting for messages: how a caller learns that a session's inbox has something queued.

Once a delivery is queued, `messaging.services.transports.schedule_pushes` announces the wake-up
(`inbox_wake_up`: the event `inbox.queued`) to the recipient's group `session.<id>` after the
commit. A caller that waits subscribes a channel to that group first (`InboxSubscription`) and
reads the database after: a message queued before the join is found there, one queued after it
arrives as the wake-up. The event only wakes; the database stays the truth, so a lost event costs
at most a re-check (every RECHECK_SECONDS), and a channel layer that fails (Redis down) turns the
wait into polling the database (every POLL_SECONDS) instead of an error.

A wait stands for the token its caller authenticated with, and ends when that token is revoked
(the session exits or is ended, or a retried registration replaces the token): the revocation's
`session.closed` on the same group sends the wait back to the database, and every read of the
database checks the token in the same query as the inbox (`inbox_queued_for`), so a wait whose
token is revoked raises `Unauthorized` before it pulls anything, whether the event arrived, was
lost, or the layer is down; what arrives stays queued for the token's new holder. (A pull that
read the token as valid just before the revocation committed finishes, as any request in flight.)

Two surfaces wait, each keeping only its own framing:
- the long-poll (`GET /api/v1/inbox?wait=`, `messaging.api`) calls `inbox_wait` with its pull,
  its deadline and its token's hash, and answers with what the pull gave (401 when the token is
  revoked meanwhile);
- the agent WebSocket (`messaging.consumers.AgentConsumer`) subscribes the channel Channels reads
  for it, pushes its pull's frames when `wakes_inbox` says an event is the wake-up, closes on
  `session.closed` (after joining it reads the session's status and token back, for a close
  announced before the join), and waits as long as it is open. Channels reads that channel from
  the layer, so a socket cannot outlive a failed layer: it ends, and its client reconnects or pulls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db.models import Exists, OuterRef

from messaging.errors import RateLimited, Unauthorized
from messaging.metrics import RATE_LIMIT_REFUSALS
from messaging.models import AgentSession, Delivery
from messaging.services.events import Announcement, session_group
from messaging.services.limits import bucket_give_back, bucket_take
from messaging.services.sessions import SESSION_CLOSED_EVENT, token_problem
from messaging.states import DeliveryState

log = logging.getLogger(__name__)
T = TypeVar("T")

INBOX_QUEUED = "inbox.queued"
# The longest a subscribed wait goes without reading the database (a wake-up lost on the way).
RECHECK_SECONDS = 5.0
# How often a wait without the channel layer reads the database.
POLL_SECONDS = 0.5


def inbox_wake_up(*, delivery_id: int, recipient_id: object) -> Announcement:
    """The wake-up for a delivery just queued: to the recipient's group only (the console hears
    of the message from the send's own events)."""
    return Announcement(
        INBOX_QUEUED,
        {"delivery_id": delivery_id, "recipient_id": str(recipient_id)},
        sessions=[recipient_id],
        operators=False,
    )


def wakes_inbox(message: dict[str, Any]) -> bool:
    """Whether a message from a session's group is (or, for `hub.events`, holds) the wake-up.
    The group also carries the session's other events, which leave its inbox as it was."""
    return _carries(message, INBOX_QUEUED)


def wakes_wait(message: dict[str, Any]) -> bool:
    """Whether a message from a session's group sends a wait back to the database: the wake-up,
    or `session.closed` (the session exited or was stopped, or its token was replaced), after
    which the database says whether the wait's token still holds."""
    return _carries(message, INBOX_QUEUED) or _carries(message, SESSION_CLOSED_EVENT)


def _carries(message: dict[str, Any], kind: str) -> bool:
    if message.get("kind") == kind:
        return True
    return any(event.get("kind") == kind for event in message.get("events", ()))


class InboxSubscription:
    """A channel subscribed to a session's group (`session.<id>`), where its wake-ups arrive."""

    def __init__(self, layer: Any, channel: str, group: str) -> None:
        self.layer, self.channel, self.group = layer, channel, group
        # The channel's next read, started by `woken` and kept pending until `leave` cancels it:
        # channels_redis' pub/sub layer drops a channel (its queue, its Redis subscription) when
        # a read of it is cancelled, and only then. Cancelled when a `woken` timed out, it lost a
        # wake-up published before the next read; never cancelled, it kept the channel for good.
        self._read: asyncio.Future[dict[str, Any]] | None = None

    @classmethod
    async def join(cls, layer: Any, channel: str, recipient_id: object) -> InboxSubscription:
        """Subscribe `channel` to the recipient's group. Read the database after this, not before:
        then nothing queued in between goes unseen. Raises what the layer raises when it fails."""
        group = session_group(recipient_id)
        await layer.group_add(group, channel)
        return cls(layer, channel, group)

    async def leave(self) -> None:
        read, self._read = self._read, None
        if read is not None and not read.done():
            read.cancel()  # the pub/sub layer lets the channel go
        elif read is not None and not read.cancelled():
            read.exception()  # taken: the wait is over whatever the read found
        await self.layer.group_discard(self.group, self.channel)

    async def woken(self, seconds: float) -> bool:
        """Read the channel until the wake-up or a `session.closed` arrives (True: read the
        database, `wakes_wait`) or `seconds` pass (False); other events are dropped. Only for a
        channel its owner reads itself (not a consumer's, which Channels reads). Raises what the
        layer raises when it fails."""
        deadline = time.monotonic() + seconds
        while True:
            if self._read is None:
                self._read = asyncio.ensure_future(self.layer.receive(self.channel))
            done, _ = await asyncio.wait({self._read}, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                return False
            message = self._read.result()
            self._read = asyncio.ensure_future(self.layer.receive(self.channel))  # see __init__
            if wakes_wait(message):
                return True


def inbox_queued_for(*, recipient_id: object, token_hash: str) -> bool:
    """Whether the recipient's inbox has a message queued, for a caller that authenticated with
    the token whose hash is `token_hash` (the database's answer, which a wake-up only prompts a
    caller to ask for). Raises `Unauthorized` when that token is revoked now: read in the same
    query as the inbox, so checking it costs a wait nothing more per wake."""
    queued = Exists(Delivery.objects.filter(recipient_id=OuterRef("pk"), state=DeliveryState.QUEUED))
    row = AgentSession.objects.filter(pk=recipient_id).values_list("status", "token_hash", queued).first()
    status, current, has_queued = row if row is not None else (None, None, False)
    problem = token_problem(token_hash, status=status, token_hash=current)
    if problem is not None:
        raise Unauthorized(problem)
    return bool(has_queued)


async def inbox_wait(
    *,
    recipient_id: object,
    token_hash: str,
    seconds: float,
    take: Callable[[], Awaitable[list[T]]],
    layer: Any = None,
) -> list[T]:
    """Wait up to `seconds` until the recipient's inbox has something queued, and answer with what
    `take` (the caller's pull) gives then; `[]` when the deadline passes first. `take` runs only
    when the database shows something queued and the caller's token (`token_hash`, the hash of
    the token it authenticated with) still holds, and the wait goes on if another pull took it
    first. Raises `Unauthorized`, having taken nothing, once the token is revoked (the session
    exited, or a retried registration replaced the token). Woken by the recipient's wake-ups and
    `session.closed` on the channel layer (`layer`, default the project's); while the layer
    fails, the database is polled instead. A session waits at most SWITCHBOARD_WAITS_PER_SESSION
    times at once (`waits_bounded`); past it, `RateLimited` at once."""
    async with waits_bounded(recipient_id):
        return await _wait(recipient_id, token_hash, seconds, take, layer)


@contextlib.asynccontextmanager
async def waits_bounded(recipient_id: object) -> AsyncIterator[None]:
    """Hold one of the session's SWITCHBOARD_WAITS_PER_SESSION places for a wait while it waits;
    raise `RateLimited` (reason `too_many_waits`) when none is free. Each wait reads the database
    every few seconds and holds a channel on the layer, so one token opening waits without end
    would load the hub for everyone. The places are a bucket on the rate-limit store (Redis when
    configured, exact across web processes) that every wait takes from and gives back to; it
    refills over ten of the longest waits, so a place a crashed process never gave back comes
    back, and the waits at once stay within about 1.1 × the bound."""
    capacity = settings.SWITCHBOARD_WAITS_PER_SESSION
    per = 10 * max(1, settings.SWITCHBOARD_INBOX_MAX_WAIT)
    wait = await sync_to_async(bucket_take, thread_sensitive=False)(
        "inbox_wait", recipient_id, capacity=capacity, per=per
    )
    if wait:
        RATE_LIMIT_REFUSALS.labels("too_many_waits").inc()
        raise RateLimited(
            f"This session already has {capacity} long-polls waiting at once (the limit). Wait "
            "for one of them to answer, or pull without waiting.",
            reason="too_many_waits",
            retry_after=math.ceil(min(wait, settings.SWITCHBOARD_INBOX_MAX_WAIT)),
        )
    try:
        yield
    finally:
        await sync_to_async(bucket_give_back, thread_sensitive=False)(
            "inbox_wait", recipient_id, capacity=capacity, per=per
        )


async def _wait(
    recipient_id: object,
    token_hash: str,
    seconds: float,
    take: Callable[[], Awaitable[list[T]]],
    layer: Any,
) -> list[T]:
    """`inbox_wait`'s wait, once it holds its place."""
    subscription = await _subscribed(layer if layer is not None else get_channel_layer(), recipient_id)
    deadline = time.monotonic() + seconds
    try:
        while True:
            # Read after joining, so a revocation committed between the caller's authentication
            # and the join is seen here, and one after it arrives as `session.closed`.
            if await sync_to_async(inbox_queued_for)(recipient_id=recipient_id, token_hash=token_hash):
                taken = await take()
                if taken:
                    return taken
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if subscription is None:
                await asyncio.sleep(min(remaining, POLL_SECONDS))
                continue
            try:
                await subscription.woken(min(remaining, RECHECK_SECONDS))
            except Exception:  # lost the layer mid-wait: keep answering from the database
                log.warning("channel layer failed; waiting for messages falls back to polling", exc_info=True)
                subscription = None
    finally:
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.leave()


async def _subscribed(layer: Any, recipient_id: object) -> InboxSubscription | None:
    """A channel of this wait's own, subscribed to the recipient's group; None (poll the database
    instead) when there is no layer or it fails (Redis down)."""
    if layer is None:
        return None
    try:
        return await InboxSubscription.join(layer, await layer.new_channel(), recipient_id)
    except Exception:
        log.warning("channel layer unavailable; waiting for messages falls back to polling", exc_info=True)
        return None
