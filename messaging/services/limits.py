"""Loop protection: what stops two agents from flooding each other (or the hub).

All keyed by session ids, never by anything a client sends:
- identical text from the same sender to the same recipient within `SWITCHBOARD_DEDUPE_SECONDS`
  is not sent again: the sender gets the original message back (`duplicate: true`);
- a token bucket per sender→recipient (`SWITCHBOARD_RATE_PAIR` per `SWITCHBOARD_RATE_PAIR_SECONDS`)
  and one for the whole hub (`SWITCHBOARD_RATE_HUB` per `SWITCHBOARD_RATE_HUB_SECONDS`);
- at most `SWITCHBOARD_UNREAD_PER_RECIPIENT` accepted-but-unread messages per recipient, and of
  those at most `SWITCHBOARD_UNREAD_PER_SENDER` from one sender, so one sender alone cannot fill a
  recipient's inbox for everyone else;
- a reply loop (both directions of a pair above `SWITCHBOARD_LOOP_EXCHANGES` messages within
  `SWITCHBOARD_LOOP_WINDOW_SECONDS`) is held for an operator instead of delivered.

Dedupe, the unread caps and loop detection are database queries, exact across processes (the
unread caps read counts the database keeps up to date with triggers: models.UnreadCount and
models.UnreadShare). The buckets live in Redis when REDIS_URL is set (one Lua script per take,
atomic across every web process), else in this process's memory (embedded mode is one process);
while Redis cannot be reached, each process keeps them in its own memory, so every limit still
holds, per process.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings
from django.db import connection

from messaging.errors import RateLimited
from messaging.metrics import RATE_LIMIT_REFUSALS
from messaging.models import AgentSession, UnreadCount, UnreadShare
from messaging.states import DeliveryState

log = logging.getLogger(__name__)
S = DeliveryState
UNREAD_STATES = (S.QUEUED, S.DELIVERED)


class BucketStore(Protocol):
    def take_many(self, wants: list[Want], now: float) -> list[tuple[int, float]]:
        """Take up to `want.count` tokens from each bucket, in one step; return (taken, seconds
        until the next one would be available) per bucket."""

    def give_back(self, wants: list[Want]) -> None:
        """Return `want.count` tokens taken with `take_many` and not spent."""


@dataclass(frozen=True)
class Want:
    """A number of tokens asked of one bucket."""

    key: str
    capacity: int
    per: float
    count: int


def gcra_many(
    tat: float | None, capacity: int, per: float, now: float, count: int
) -> tuple[float, int, float]:
    """`gcra` `count` times in a row, stopping at the first refusal: (new tat, taken, wait)."""
    taken, wait = 0, 0.0
    while taken < count:
        new, wait = gcra(tat, capacity, per, now)
        if wait:
            break
        tat, taken = new, taken + 1
    return (tat if tat is not None else now), taken, wait


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

    def take_many(self, wants: list[Want], now: float) -> list[tuple[int, float]]:
        answers = []
        with self._lock:
            if len(self._tats) > 100_000:  # forget buckets that have refilled
                self._tats = {k: v for k, v in self._tats.items() if v[1] > now}
            for want in wants:
                held = self._tats.get(want.key)
                tat = held[0] if held and held[1] > now else None
                new, taken, wait = gcra_many(tat, want.capacity, want.per, now, want.count)
                if taken:
                    self._tats[want.key] = (new, now + want.per + 1)
                answers.append((taken, wait))
        return answers

    def give_back(self, wants: list[Want]) -> None:
        with self._lock:
            for want in wants:
                held = self._tats.get(want.key)
                if held is not None:
                    self._tats[want.key] = (held[0] - want.count * want.per / want.capacity, held[1])

    def clear(self) -> None:
        with self._lock:
            self._tats.clear()


# `gcra_many` for many buckets at once, atomic in Redis: ARGV is now, then interval, per and count
# for each key. Stops at a bucket's first refusal, as that many single takes in a row would.
_GCRA_MANY_LUA = """
local now = tonumber(ARGV[1])
local answers = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[i * 3 - 1])
  local per = tonumber(ARGV[i * 3])
  local count = tonumber(ARGV[i * 3 + 1])
  local tat = tonumber(redis.call('GET', key) or ARGV[1])
  if tat < now then tat = now end
  local taken, wait = 0, 0
  while taken < count do
    local new = tat + interval
    if new - now > per + 1e-6 then
      wait = new - now - per
      break
    end
    -- Rounded as it is stored between two calls (%.6f, not tostring: Lua's tostring keeps 14
    -- digits, which rounds a Unix time to 0.1 ms), so n tokens here cost what n calls of one do.
    tat, taken = tonumber(string.format('%.6f', new)), taken + 1
  end
  if taken > 0 then
    redis.call('SET', key, string.format('%.6f', tat), 'PX', math.ceil(per * 1000) + 1000)
  end
  answers[i] = {taken, string.format('%.6f', wait)}
end
return answers
"""

# Gives back unspent tokens: moves each key's tat back by count intervals, keeping its expiry.
_GIVE_BACK_LUA = """
for i, key in ipairs(KEYS) do
  local tat = redis.call('GET', key)
  if tat then
    local back = tonumber(tat) - tonumber(ARGV[i * 2 - 1]) * tonumber(ARGV[i * 2])
    redis.call('SET', key, string.format('%.6f', back), 'KEEPTTL')
  end
end
return 0
"""


class RedisBuckets:
    """Buckets in Redis: atomic per take, shared by every web and worker process."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._many = self._client.register_script(_GCRA_MANY_LUA)
        self._give_back = self._client.register_script(_GIVE_BACK_LUA)

    def take_many(self, wants: list[Want], now: float) -> list[tuple[int, float]]:
        args = [repr(now)]
        for want in wants:
            args += [repr(want.per / want.capacity), repr(want.per), str(want.count)]
        answers = self._many(keys=[w.key for w in wants], args=args)
        return [(int(taken), float(wait)) for taken, wait in answers]

    def give_back(self, wants: list[Want]) -> None:
        args = []
        for want in wants:
            args += [str(want.count), repr(want.per / want.capacity)]
        self._give_back(keys=[w.key for w in wants], args=args)


class SharedBuckets:
    """The shared store (Redis) with this process's buckets behind it: while Redis cannot be
    reached, every take and give-back goes to the process's own buckets, so each limit still holds
    in each web process (at most its capacity per process, not none) and the hub keeps answering."""

    def __init__(self, shared: BucketStore, local: BucketStore | None = None) -> None:
        self._shared = shared
        self._local = local if local is not None else MemoryBuckets()
        self._warned_at = -math.inf

    def take_many(self, wants: list[Want], now: float) -> list[tuple[int, float]]:
        try:
            return self._shared.take_many(wants, now)
        except Exception:
            self._unreachable()
            return self._local.take_many(wants, now)

    def give_back(self, wants: list[Want]) -> None:
        try:
            self._shared.give_back(wants)
        except Exception:
            self._unreachable()
            self._local.give_back(wants)

    def _unreachable(self) -> None:
        # One warning a minute while the outage lasts: every request would otherwise log one.
        if time.monotonic() - self._warned_at >= 60:
            self._warned_at = time.monotonic()
            log.warning(
                "rate-limit store unavailable; limits hold per process until it is back", exc_info=True
            )


_stores: dict[str, BucketStore] = {}
_stores_lock = threading.Lock()


def bucket_store() -> BucketStore:
    """The rate-limit store: Redis when REDIS_URL is set (this process's buckets while it is
    unreachable), else this process's buckets (embedded mode is one process)."""
    url = settings.REDIS_URL or ""
    with _stores_lock:
        if url not in _stores:
            _stores[url] = SharedBuckets(RedisBuckets(url)) if url else MemoryBuckets()
        return _stores[url]


def _key(*parts: object) -> str:
    # The database name keeps parallel test runs (and hubs sharing one Redis) apart.
    return ":".join(
        [settings.SWITCHBOARD_LIMITS_PREFIX, str(connection.settings_dict.get("NAME")), *map(str, parts)]
    )


def bucket_take(*parts: object, capacity: int, per: float) -> float:
    """Take one token from the bucket named by `parts` (`capacity` per `per` seconds), for limits
    other apps keep on the same store. Returns 0 when taken, else the seconds until one is free."""
    [(taken, wait)] = bucket_store().take_many([Want(_key(*parts), capacity, per, 1)], time.time())
    return 0.0 if taken else max(wait, 1e-6)


def bucket_give_back(*parts: object, capacity: int, per: float) -> None:
    """Return one token taken with `bucket_take` from the bucket named by `parts` and not spent
    (a bucket then bounds how many of something are under way at once, not how often they start)."""
    bucket_store().give_back([Want(_key(*parts), capacity, per, 1)])


# The kept counts as scalar subqueries, for the reads that take them with other facts in one
# statement: the recipient's unread count (parameter: recipient id) and the sender's share of it
# (parameters: recipient id, sender id).
UNREAD_SQL = f"(SELECT COALESCE(SUM(n), 0) FROM {UnreadCount._meta.db_table} WHERE recipient_id = %s)"
UNREAD_SHARE_SQL = f"(SELECT COALESCE(SUM(n), 0) FROM {UnreadShare._meta.db_table} WHERE recipient_id = %s AND sender_id = %s)"


def unread_counted(*, recipient_id: object, sender_id: object) -> tuple[int, int]:
    """The recipient's unread count and, of it, the sender's (what the sender's share of the cap
    checks), in one query of the counts the database keeps (models.UnreadCount, UnreadShare)."""
    ident = functools.partial(AgentSession._meta.pk.get_db_prep_value, connection=connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {UNREAD_SQL}, {UNREAD_SHARE_SQL}",
            [ident(recipient_id), ident(recipient_id), ident(sender_id)],
        )
        unread, own = cursor.fetchone()
    return int(unread), int(own)


def hub_rate_limited(wait: float) -> RateLimited:
    RATE_LIMIT_REFUSALS.labels("hub_rate").inc()
    return RateLimited(
        f"The hub is taking more messages than it allows right now; wait {math.ceil(wait)} s and send again.",
        reason="hub_rate",
        retry_after=math.ceil(wait),
    )


def pair_rate_limited(recipient: AgentSession, wait: float) -> RateLimited:
    RATE_LIMIT_REFUSALS.labels("pair_rate").inc()
    return RateLimited(
        f"You are sending to {recipient.label} faster than {settings.SWITCHBOARD_RATE_PAIR} messages per "
        f"{settings.SWITCHBOARD_RATE_PAIR_SECONDS} s. Combine what you have into one message, or wait "
        f"{math.ceil(wait)} s.",
        reason="pair_rate",
        retry_after=math.ceil(wait),
    )


def queue_full(recipient: AgentSession) -> RateLimited:
    """The recipient's inbox is at its unread cap. The sentence names the cap, never the
    recipient's unread count: how much waits in another session's inbox (hub-made notices and
    released holds pass the cap) is its activity, not the sender's to learn."""
    RATE_LIMIT_REFUSALS.labels("recipient_queue_full").inc()
    return RateLimited(
        f"{recipient.label}'s inbox is full: it holds the most unread messages a session may have "
        f"waiting ({settings.SWITCHBOARD_UNREAD_PER_RECIPIENT}). Wait until it reads some before "
        "sending more.",
        reason="recipient_queue_full",
        retry_after=settings.SWITCHBOARD_RATE_PAIR_SECONDS,
    )


def unread_share_full(recipient: AgentSession, own: int) -> RateLimited:
    RATE_LIMIT_REFUSALS.labels("unread_share_full").inc()
    return RateLimited(
        f"{recipient.label} has not read {own} of your messages yet, and one sender may have at most "
        f"{settings.SWITCHBOARD_UNREAD_PER_SENDER} unread messages waiting there. Wait until they read "
        "them before sending more.",
        reason="unread_share_full",
        retry_after=settings.SWITCHBOARD_RATE_PAIR_SECONDS,
    )


@dataclass
class TokenReservation:
    """Tokens a batch send takes ahead, in one store call: `spend` then stands in for the rate
    checks of one send (the pair's bucket, then the hub's) and `release` gives back what
    was not spent, so each bucket is charged exactly what that many single sends would have cost."""

    sender: AgentSession
    # bucket key → [tokens held, seconds until its next token once they are spent (0: not known)]
    held: dict[str, list[float]] = field(default_factory=dict)
    buckets: dict[object, tuple[Want, Want]] = field(default_factory=dict)  # recipient id → (hub, pair)

    def spend(self, recipient: AgentSession) -> None:
        """Spend one pair and one hub token for a message to `recipient`; raise RateLimited when
        either bucket is empty. The pair's comes first: a message its own pair refuses costs the
        hub-wide bucket nothing, so one sender cannot empty it by sending faster than a pair allows."""
        buckets = self.buckets.get(recipient.id)
        if buckets is None:
            buckets = self.buckets[recipient.id] = (_hub_want(1), _pair_want(self.sender, recipient.id, 1))
        wait = self._spend(buckets[1])
        if wait:
            raise pair_rate_limited(recipient, wait)
        wait = self._spend(buckets[0])
        if wait:
            raise hub_rate_limited(wait)

    def _spend(self, want: Want) -> float:
        held = self.held.get(want.key)
        if held is None or (held[0] <= 0 and not held[1]):
            # More than was reserved (a later item's address resolved differently): take one more.
            self.take([want])
            held = self.held[want.key]
        if held[0] <= 0:
            return held[1]
        held[0] -= 1
        return 0.0

    def take(self, wants: list[Want]) -> None:
        """Take the tokens `wants` asks for, in one store call, and hold them."""
        answers = bucket_store().take_many(wants, time.time())
        for want, (taken, wait) in zip(wants, answers, strict=True):
            held = self.held.setdefault(want.key, [0, 0.0])
            held[0] += taken
            held[1] = wait

    def release(self) -> None:
        """Give back every token not spent (call once, when the batch is done with them)."""
        wants = [Want(key, *_bucket_of(key), int(n)) for key, (n, _wait) in self.held.items() if n > 0]
        self.held = {}
        if not wants:
            return
        bucket_store().give_back(wants)


def _hub_want(count: int) -> Want:
    return Want(_key("hub"), settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS, count)


def _pair_want(sender: AgentSession, recipient_id: object, count: int) -> Want:
    return Want(
        _key("pair", sender.id, recipient_id),
        settings.SWITCHBOARD_RATE_PAIR,
        settings.SWITCHBOARD_RATE_PAIR_SECONDS,
        count,
    )


def _bucket_of(key: str) -> tuple[int, float]:
    """A bucket's capacity and period, from its key."""
    if key == _key("hub"):
        return settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS
    return settings.SWITCHBOARD_RATE_PAIR, settings.SWITCHBOARD_RATE_PAIR_SECONDS


def limits_reserve(*, sender: AgentSession, recipient_ids: Iterable[object]) -> TokenReservation:
    """Take, in one store call, a pair token for each message to each recipient (`recipient_ids`:
    the recipient of each message a batch may send) and a hub token for each message its pair's
    bucket could let through (at most its capacity per recipient): a batch holds no more of the
    hub-wide bucket, while it runs, than it can spend. Spend them with `spend`, then `release`
    the rest."""
    counts: dict[object, int] = {}
    for recipient_id in recipient_ids:
        counts[recipient_id] = counts.get(recipient_id, 0) + 1
    reservation = TokenReservation(sender=sender)
    if counts:
        passable = sum(min(count, settings.SWITCHBOARD_RATE_PAIR) for count in counts.values())
        reservation.take(
            [_hub_want(passable)]
            + [_pair_want(sender, recipient_id, count) for recipient_id, count in counts.items()]
        )
    return reservation
