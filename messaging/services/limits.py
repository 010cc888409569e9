"""Loop protection: what stops two agents from flooding each other (or the hub).

All keyed by session ids, never by anything a client sends:
- identical text from the same sender to the same recipient within `SWITCHBOARD_DEDUPE_SECONDS`
  is not sent again: the sender gets the original message back (`duplicate: true`);
- a token bucket per sender→recipient (`SWITCHBOARD_RATE_PAIR` per `SWITCHBOARD_RATE_PAIR_SECONDS`)
  and one for the whole hub (`SWITCHBOARD_RATE_HUB` per `SWITCHBOARD_RATE_HUB_SECONDS`);
- at most `SWITCHBOARD_UNREAD_PER_RECIPIENT` accepted-but-unread messages per recipient;
- a reply loop (both directions of a pair above `SWITCHBOARD_LOOP_EXCHANGES` messages within
  `SWITCHBOARD_LOOP_WINDOW_SECONDS`) is held for an operator instead of delivered.

Dedupe, the unread cap and loop detection are database queries, exact across processes. The
buckets live in Redis when REDIS_URL is set (one Lua script per take, atomic across every web
process), else in this process's memory (embedded mode is one process).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from django.db import connection
from django.db.models import Q

from messaging.errors import RateLimited
from messaging.models import AgentSession, Delivery, Message, MessageKind
from messaging.states import DeliveryState

log = logging.getLogger(__name__)
S = DeliveryState
UNREAD_STATES = (S.QUEUED, S.DELIVERED)


class BucketStore(Protocol):
    def take(self, key: str, capacity: int, per: float, now: float) -> float:
        """Take one token; return 0 when allowed, else seconds until one is available."""


def gcra(tat: float | None, capacity: int, per: float, now: float) -> tuple[float, float]:
    """A token bucket as the generic cell rate algorithm: one stored number per key (the
    theoretical arrival time). Returns (new tat, 0) when allowed, (old tat, wait) when not."""
    interval = per / capacity
    tat = max(tat if tat is not None else now, now)
    new = tat + interval
    if new - now > per + 1e-6:
        return tat, new - now - per
    return new, 0.0


class MemoryBuckets:
    """Buckets in this process (embedded mode and the SQLite test suite)."""

    def __init__(self) -> None:
        self._tats: dict[str, tuple[float, float]] = {}  # key → (tat, forget after)
        self._lock = threading.Lock()

    def take(self, key: str, capacity: int, per: float, now: float) -> float:
        with self._lock:
            if len(self._tats) > 100_000:
                self._tats = {k: v for k, v in self._tats.items() if v[1] > now}
            held = self._tats.get(key)
            tat = held[0] if held and held[1] > now else None
            new, wait = gcra(tat, capacity, per, now)
            if not wait:
                self._tats[key] = (new, now + per + 1)
            return wait

    def clear(self) -> None:
        with self._lock:
            self._tats.clear()


_GCRA_LUA = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local per = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if tat < now then tat = now end
local new = tat + interval
if new - now > per + 1e-6 then return string.format('%.6f', new - now - per) end
-- %.6f, not tostring: Lua's tostring keeps 14 digits, which rounds a Unix time to 0.1 ms.
redis.call('SET', KEYS[1], string.format('%.6f', new), 'PX', math.ceil(per * 1000) + 1000)
return '0'
"""


class RedisBuckets:
    """Buckets in Redis: atomic per take, shared by every web and worker process."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._script = self._client.register_script(_GCRA_LUA)

    def take(self, key: str, capacity: int, per: float, now: float) -> float:
        return float(self._script(keys=[key], args=[repr(now), repr(per / capacity), repr(per)]))


_stores: dict[str, BucketStore] = {}
_stores_lock = threading.Lock()


def bucket_store() -> BucketStore:
    url = settings.REDIS_URL or ""
    with _stores_lock:
        if url not in _stores:
            _stores[url] = RedisBuckets(url) if url else MemoryBuckets()
        return _stores[url]


def _key(*parts: object) -> str:
    # The database name keeps parallel test runs (and hubs sharing one Redis) apart.
    return ":".join(
        [settings.SWITCHBOARD_LIMITS_PREFIX, str(connection.settings_dict.get("NAME")), *map(str, parts)]
    )


def _take(key: str, capacity: int, per: float) -> float:
    try:
        return bucket_store().take(key, capacity, per, time.time())
    except Exception:  # Redis down: the database still bounds the queue and catches loops
        log.warning("rate-limit store unavailable; letting the send through", exc_info=True)
        return 0.0


def limits_find_duplicate(
    *, sender: AgentSession, recipient: AgentSession, sha256: str, now: datetime
) -> Message | None:
    """The message this sender sent this recipient with the same text within the dedupe window."""
    window = settings.SWITCHBOARD_DEDUPE_SECONDS
    if window <= 0:
        return None
    return (
        Message.objects.filter(
            sender=sender,
            sha256=sha256,
            kind=MessageKind.TEXT,
            created_at__gte=now - timedelta(seconds=window),
            deliveries__recipient=recipient,
        )
        .order_by("-created_at")
        .first()
    )


def limits_take(*, sender: AgentSession, recipient: AgentSession, unread: int | None = None) -> None:
    """Spend a token from the hub's bucket and from the sender→recipient bucket, and check the
    recipient's unread queue (`unread`: already counted up to the cap, e.g. by `pair_facts`).
    Raises RateLimited with a sentence saying how long to wait."""
    wait = _take(_key("hub"), settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS)
    if wait:
        raise RateLimited(
            f"The hub is taking more messages than it allows right now; wait {math.ceil(wait)} s and send again.",
            reason="hub_rate",
            retry_after=math.ceil(wait),
        )
    wait = _take(
        _key("pair", sender.id, recipient.id),
        settings.SWITCHBOARD_RATE_PAIR,
        settings.SWITCHBOARD_RATE_PAIR_SECONDS,
    )
    if wait:
        raise RateLimited(
            f"You are sending to {recipient.label} faster than {settings.SWITCHBOARD_RATE_PAIR} messages per "
            f"{settings.SWITCHBOARD_RATE_PAIR_SECONDS} s. Combine what you have into one message, or wait "
            f"{math.ceil(wait)} s.",
            reason="pair_rate",
            retry_after=math.ceil(wait),
        )
    cap = settings.SWITCHBOARD_UNREAD_PER_RECIPIENT
    waiting = Delivery.objects.filter(recipient=recipient, state__in=UNREAD_STATES)
    # Count no further than the cap (all the check needs), so a long inbox costs no more than a short
    # one; only a refusal counts them all, for its sentence.
    if (waiting[:cap].count() if unread is None else unread) >= cap:
        unread = waiting.count()
        raise RateLimited(
            f"{recipient.label} already has {unread} unread messages waiting (the limit is {cap}). "
            "Wait until they read them before sending more.",
            reason="recipient_queue_full",
            retry_after=settings.SWITCHBOARD_RATE_PAIR_SECONDS,
        )


def loop_suspected(*, replies: int, sends: int) -> bool:
    """The reply-loop rule on counts already taken (`pair_facts`): both directions of the pair at
    or above the loop threshold within the window."""
    threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
    return threshold > 0 and replies >= threshold and sends >= threshold


def limits_loop_suspected(*, sender: AgentSession, recipient: AgentSession, now: datetime) -> bool:
    """True when the pair has exchanged more than the loop threshold in both directions within the
    window: they are probably answering each other in a loop, so a human should look."""
    threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
    if threshold <= 0:
        return False
    since = now - timedelta(seconds=settings.SWITCHBOARD_LOOP_WINDOW_SECONDS)
    there = Q(message__sender=sender, recipient=recipient)
    back = Q(message__sender=recipient, recipient=sender)
    # Plain text only: team frames and hub notifications are typed traffic, not agents replying.
    recent = Delivery.objects.filter(message__created_at__gte=since, message__kind=MessageKind.TEXT)
    # Each direction only needs counting up to the threshold; the reply direction, usually the
    # short one, first.
    if recent.filter(back)[:threshold].count() < threshold:
        return False
    return recent.filter(there)[:threshold].count() >= threshold
