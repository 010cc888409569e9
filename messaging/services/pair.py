"""What the send pipeline needs to know about a sender → recipient pair, read in one round trip.

A send checks observers, the dedupe window, the recipient's unread cap and the sender's share of
it, the recipient's per-sender policy, both directions of a possible reply loop and the sender's pin
for the name it used. Asked one query at a time that is eight round trips through the ORM, most of
a send's cost; here they are scalar subqueries of one SELECT (plain SQL that SQLite and PostgreSQL
both run), each bounded by the index it uses and by a LIMIT where it counts, so the cost does not
grow with an inbox (the unread counts are read from the counts the database keeps, not counted).
The rules that use these facts stay in their modules (limits, policy, observers, addressing).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection

from messaging.models import (
    AgentSession,
    Delivery,
    Message,
    MessageKind,
    Pin,
    SenderPolicy,
)
from messaging.plugins import PLUGINS
from messaging.services.bulk import as_uuid
from messaging.services.limits import UNREAD_SHARE_SQL, UNREAD_SQL


@dataclass(frozen=True)
class PairFacts:
    """Counts are exact up to the limit they were asked with, and stop there."""

    sender_is_observer: bool
    recipient_is_observer: bool
    duplicate_of: uuid.UUID | None  # same text to the same recipient within the dedupe window
    unread: int  # the recipient's queued + delivered messages (models.UnreadCount)
    unread_own: int  # of those, the sender's (models.UnreadShare)
    policy: str | None  # the recipient's rule for this sender (accept / hold / refuse), if any
    policy_by_operator: bool
    loop_replies: int  # recipient → sender texts within the loop window, up to the threshold
    # sender → recipient texts within the loop window, up to the threshold; counted only when
    # loop_replies reached it (else 0): a loop needs both, and most traffic goes one way. Counting
    # it reads the sender's recent messages, which grow with how much the sender writes.
    loop_sends: int
    pinned_to: uuid.UUID | None  # whom the sender's pin for the name it used points at


def dedupe_key(sender_id: uuid.UUID, sha256: str) -> str:
    """What the dedupe rule looks a sender's text up by (`Message.dedupe_key`): one value per
    sender and text, so the lookup is a single indexed equality (migration 0005 has the formula)."""
    return hashlib.sha256(f"{sender_id.hex}:{sha256}".encode()).hexdigest()


def pair_key(sender_id: uuid.UUID, recipient_id: uuid.UUID) -> uuid.UUID:
    """What loop protection counts a pair's texts by (`Message.pair_key`): one value per sender →
    recipient direction, so the count is one index range (migration 0006 has the formula)."""
    return uuid.UUID(bytes=hashlib.sha256(f"{sender_id.hex}>{recipient_id.hex}".encode()).digest()[:16])


# The far end of a pair's texts in `pair_texts_sql`'s range of (pair_key, created_at).
END_OF_TIME = datetime(9999, 12, 31, tzinfo=UTC)


def pair_texts_sql() -> str:
    """One direction of a pair's texts within the loop window, as a subquery to count up to a
    limit; parameters: `pair_texts_params`. The condition is a range of `message_pair_recent`'s
    own key, from (the pair, the window's start) to (the pair, END_OF_TIME), read in that index's
    order: no other index can serve the range or the order, and the table only by reading all of
    it and sorting, so any plan, a generic one or one made for the values, reads only the pair's
    recent texts, once the table has statistics (the hub gathers a table's first within seconds
    of its first rows: messaging.services.statistics). A condition of the form `pair_key = … AND
    created_at >= …` would leave the planner free to count through the `created_at` index over
    the hub's whole window, or to scan the table."""
    return (
        f"SELECT 1 FROM {Message._meta.db_table} "
        "WHERE (pair_key, created_at) >= (%s, %s) AND (pair_key, created_at) <= (%s, %s) AND kind = %s "
        "ORDER BY pair_key, created_at LIMIT %s"
    )


def pair_texts_params(
    sender_id: uuid.UUID, recipient_id: uuid.UUID, *, since: datetime, limit: int
) -> list[object]:
    """`pair_texts_sql`'s parameters for the sender → recipient texts written since `since`."""
    key = Message._meta.pk.get_db_prep_value(pair_key(sender_id, recipient_id), connection)
    created_at = Message._meta.get_field("created_at")
    start, end = (created_at.get_db_prep_value(moment, connection) for moment in (since, END_OF_TIME))
    return [key, start, key, end, MessageKind.TEXT.value, limit]


@functools.cache
def _statement() -> str:
    message, delivery = Message._meta.db_table, Delivery._meta.db_table
    policy, pin = SenderPolicy._meta.db_table, Pin._meta.db_table
    restricted = PLUGINS.send_guard.restricted_sql
    return f"""
        SELECT
          {restricted},
          {restricted},
          (SELECT m.id FROM {message} m JOIN {delivery} d ON d.message_id = m.id
            WHERE m.dedupe_key = %s AND m.kind = %s AND m.created_at >= %s AND d.recipient_id = %s
            ORDER BY m.created_at DESC LIMIT 1),
          {UNREAD_SQL},
          {UNREAD_SHARE_SQL},
          (SELECT action FROM {policy} WHERE recipient_id = %s AND sender_id = %s),
          (SELECT by_operator FROM {policy} WHERE recipient_id = %s AND sender_id = %s),
          loop.replies,
          CASE WHEN loop.replies >= %s THEN (SELECT COUNT(*) FROM ({pair_texts_sql()}) AS sends) ELSE 0 END,
          (SELECT recipient_id FROM {pin} WHERE sender_id = %s AND name_key = %s)
        FROM (SELECT COUNT(*) AS replies FROM ({pair_texts_sql()}) AS replies) AS loop
    """


def pair_facts(
    *, sender: AgentSession, recipient: AgentSession, sha256: str, now: datetime, pin_key: str = ""
) -> PairFacts:
    """Read every per-pair fact a send decides on, in one query (see the module docstring)."""
    uuid_field, time_field = Message._meta.pk, Message._meta.get_field("created_at")

    def ident(value: uuid.UUID) -> object:
        return uuid_field.get_db_prep_value(value, connection)

    def since(seconds: int) -> object:
        return time_field.get_db_prep_value(now - timedelta(seconds=max(seconds, 0)), connection)

    s, r = ident(sender.id), ident(recipient.id)
    loop_start = now - timedelta(seconds=max(settings.SWITCHBOARD_LOOP_WINDOW_SECONDS, 0))
    loop_limit = max(settings.SWITCHBOARD_LOOP_EXCHANGES, 0)  # SQLite reads a negative LIMIT as none
    text = MessageKind.TEXT.value
    params = [
        s,
        r,
        *(dedupe_key(sender.id, sha256), text, since(settings.SWITCHBOARD_DEDUPE_SECONDS), r),
        r,
        *(r, s),
        *(r, s, r, s),
        loop_limit,
        *pair_texts_params(sender.id, recipient.id, since=loop_start, limit=loop_limit),
        *(s, pin_key),
        *pair_texts_params(recipient.id, sender.id, since=loop_start, limit=loop_limit),
    ]
    # Prepared, as every statement a send runs: any plan PostgreSQL may keep for it reads only
    # the pair's rows. Each count is a range of the pair's index (`pair_texts_sql`); the dedupe
    # lookup asks for one key among about as many as there are texts, which every plan reads by
    # its index. (tests/messaging/test_pair_facts.py runs the read under both kinds of plan.)
    with connection.cursor() as cursor:
        cursor.execute(_statement(), params)
        row = cursor.fetchone()
    observer_s, observer_r, duplicate, unread, own, policy, by_operator, replies, sends, pinned = row
    return PairFacts(
        sender_is_observer=bool(observer_s),
        recipient_is_observer=bool(observer_r),
        duplicate_of=as_uuid(duplicate) if settings.SWITCHBOARD_DEDUPE_SECONDS > 0 else None,
        unread=int(unread),
        unread_own=int(own),
        policy=policy,
        policy_by_operator=bool(by_operator),
        loop_replies=int(replies),
        loop_sends=int(sends),
        pinned_to=as_uuid(pinned),
    )
