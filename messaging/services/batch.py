"""Sends in bulk: many messages, from one sender (a batch) or from many (a group sent together),
each with the outcome a single send gives.

`messages_send_batch` runs each item through the rules of `message_send` (validation, the
idempotency key, resolution and pins, dedupe, rate limits and the unread cap, policy, loop
protection), but it asks the database each question once for all the items (`read_ahead`: the
texts they could repeat, whom their addresses mean, each sender → recipient pair's facts) and
keeps what the earlier items changed in memory, then writes the messages, their deliveries and
their audit events with one statement per table. `messages_send_together` does the same for
sends of any senders in one transaction: each sender's sends as one batch, the senders one after
another, their reads ahead and their writes shared (`_Writes`).

The common case (a live local recipient, plain text) takes this bulk path. An item that needs a
rare path (attached files, an address no local session takes — a federation route —, a stopped
or remote recipient, a session messaging itself, a field the bulk path does not know) is sent with
`message_send` itself, in order: what was accepted so far is written first, so that send sees
exactly what it would have seen after the earlier items were sent one by one.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from messaging.addressing import Resolution, parse_address
from messaging.errors import IdempotencyConflict, Invalid, NotFound, PinConflict, SwitchboardError
from messaging.liveness import LIVE
from messaging.models import (
    REMOTE_KIND,
    AgentSession,
    Delivery,
    DeliveryTier,
    Message,
    MessageKind,
    Pin,
    Priority,
    SenderPolicy,
    Tier,
    UnreadCount,
)
from messaging.plugins import PLUGINS
from messaging.policy import HOST_VERIFIED, Verdict
from messaging.principals import Principal, session_principal
from messaging.sensitivity import classify
from messaging.services.bulk import as_uuid
from messaging.services.decision import Decision, decide
from messaging.services.events import Announcement
from messaging.services.holds import STOPPED_HOLD, holds_make_room
from messaging.services.limits import (
    TokenReservation,
    limits_reserve,
    queue_full,
    unread_count,
)
from messaging.services.pair import dedupe_key, pair_texts_params, pair_texts_sql
from messaging.services.request import SendRequest
from messaging.services.sending import (
    SendOutcome,
    acceptance_audit,
    accepted_message,
    decision_facts,
    first_delivery,
    idempotency_lock_id,
    message_event,
    message_send,
    messages_write,
    recipients_resolved,
    reply_checked,
    resolve_recipient_pinned,
    send_input_checked,
)
from messaging.services.transports import UDS_PREFIX, schedule_pushes
from messaging.states import DeliveryState

S = DeliveryState
BATCH_MAX = 1000
# The item fields the bulk path handles; an item with any other field is sent by `message_send`.
BULK_FIELDS = frozenset({"to", "text", "summary", "idempotency_key", "priority", "in_reply_to", "files"})
# Resolution rules whose address is checked against (and written to) the sender's pins.
PIN_CHECKED_RULES = ("name", "normalized", "prefix")
_NOT_READ = object()  # a pin the batch has not read: written whatever it points at


def messages_send_batch(
    *, sender: AgentSession, items: list[dict[str, Any]], actor: Principal | None = None
) -> list[SendOutcome | SwitchboardError]:
    """Send many messages in one request. Each item holds a `SendRequest`'s fields (to,
    text, summary, idempotency_key, priority, in_reply_to, files) and goes through exactly the same
    validation, resolution, limits and policy, with the same outcome a single send would give.
    One transaction: the answer comes only after every accepted item is committed (a database
    failure accepts none). An item that fails a rule is reported in its place, as the error a
    single send would raise, and the others go on."""
    if not items:
        raise Invalid("empty_batch", "A batch needs at least one message.")
    if len(items) > BATCH_MAX:
        raise Invalid("batch_too_large", f"A batch takes at most {BATCH_MAX} messages; split it.")
    with transaction.atomic():
        writes = _Writes()
        results = _Batch(sender=sender, actor=actor or session_principal(sender), writes=writes).send(items)
        writes.write()
        return results


@dataclass
class Send:
    """One send of a group sent together: who sends, as whom, and the other fields of its
    `SendRequest` (BULK_FIELDS)."""

    sender: AgentSession
    actor: Principal
    fields: dict[str, Any]


def messages_send_together(sends: list[Send]) -> list[SendOutcome | SwitchboardError]:
    """Send a group of sends from any senders in one transaction, each with the outcome it would
    have had on its own, in the order given: each sender's sends go as one batch (in their order,
    so a pair's messages keep theirs), the senders one after another as they first appear, and all
    their messages are written together. The answer comes only after the lot is committed; a
    database failure commits none."""
    by_sender: dict[tuple[Any, str], list[int]] = {}
    for position, send in enumerate(sends):
        by_sender.setdefault((send.sender.id, send.actor.actor), []).append(position)
    results: list[SendOutcome | SwitchboardError | None] = [None] * len(sends)
    with transaction.atomic():
        # Every idempotency key of the group locked at once, in one order: two groups (in two web
        # processes) that share keys never wait on each other in a cycle.
        idempotency_keys_locked(
            [
                (send.sender.id, key)
                for send in sends
                if isinstance(key := send.fields.get("idempotency_key"), str) and 0 < len(key) <= 128
            ]
        )
        writes = _Writes()
        batches = []
        for positions in by_sender.values():
            first = sends[positions[0]]
            batch = _Batch(sender=first.sender, actor=first.actor, writes=writes, keys_locked=True)
            batches.append((batch, positions, batch.prepared([sends[p].fields for p in positions])))
        read_ahead([(batch, items) for batch, _positions, items in batches], now=writes.now)
        for batch, positions, items in batches:
            for position, result in zip(positions, batch.send_prepared(items), strict=True):
                results[position] = result
        writes.write()
    assert all(result is not None for result in results)
    return results  # type: ignore[return-value]


def idempotency_keys_locked(keys: list[tuple[Any, str]]) -> None:
    """Lock (sender id, idempotency key) pairs until the transaction ends, as a single send locks
    its one (PostgreSQL advisory locks; SQLite's IMMEDIATE transaction already serializes every
    writer). The same lock ids as a single send's, taken in one order so two batches never deadlock."""
    if connection.vendor != "postgresql" or not keys:
        return
    locks = sorted({idempotency_lock_id(sender_id=str(sender_id), key=key) for sender_id, key in keys})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(id) FROM unnest(%s::bigint[]) AS id", [locks])


def read_ahead(batches: list[tuple[_Batch, list[_Item]]], *, now: Any) -> None:
    """What the batches of one transaction read before they send, in a few queries for all of
    them: the texts they could repeat, whom their addresses mean (with the senders' pins), and
    the facts of each sender → live recipient pair. Each batch gets its own: what one sender's
    batch writes changes none of it for another but the counts that `_Writes` keeps."""
    recent_texts_read(batches, now=now)
    wanted = {
        (batch.sender.id, item.target): (batch, item.target)
        for batch, items in batches
        for item in items
        if item.error is None and not item.single
    }
    if not wanted:
        return
    found = recipients_resolved([(batch.sender, target) for batch, target in wanted.values()])
    pairs = []
    for key, (batch, target) in wanted.items():
        batch.resolution_kept(target, found[key])
        if isinstance(found[key], tuple) and batch.sends_in_bulk_to(found[key][0]):
            pairs.append((batch, found[key][0].id))
    facts = pair_facts_read([(batch.sender.id, recipient_id) for batch, recipient_id in pairs], now=now)
    for batch, recipient_id in pairs:
        batch.facts[recipient_id] = facts[(batch.sender.id, recipient_id)]


def pair_facts_read(
    pairs: list[tuple[Any, Any]], *, now: Any
) -> dict[tuple[Any, Any], tuple[bool, str | None, bool, int, int]]:
    """Per (sender id, recipient id), in one query for all: whether either is an observer, the
    recipient's rule for the sender (action, set by an operator), the recipient's texts to the
    sender within the loop window (counted up to the threshold) and the recipient's unread count
    (the counts the database keeps, models.UnreadCount). Separately they are four round trips per
    pair; none of them changes with what a batch sends but the counts (see `_Writes`)."""
    pairs = list(dict.fromkeys(pairs))
    if not pairs:
        return {}
    restricted, policy = PLUGINS.send_guard.restricted_sql, SenderPolicy._meta.db_table
    unread = UnreadCount._meta.db_table
    ident = functools.partial(Message._meta.pk.get_db_prep_value, connection=connection)
    threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
    since = now - timedelta(seconds=settings.SWITCHBOARD_LOOP_WINDOW_SECONDS)
    parts, params = [], []
    for place, (sender_id, recipient_id) in enumerate(pairs):
        parts.append(
            f"""
            SELECT {place},
              ({restricted} OR {restricted}),
              (SELECT action FROM {policy} WHERE recipient_id = %s AND sender_id = %s),
              (SELECT by_operator FROM {policy} WHERE recipient_id = %s AND sender_id = %s),
              (SELECT COUNT(*) FROM ({pair_texts_sql()}) AS replies),
              (SELECT COALESCE(SUM(n), 0) FROM {unread} WHERE recipient_id = %s)
            """
        )
        sender, recipient = ident(sender_id), ident(recipient_id)
        params += [sender, recipient, recipient, sender, recipient, sender]
        params += pair_texts_params(recipient_id, sender_id, since=since, limit=max(threshold, 1))
        params += [recipient]
    # Prepared like the single send's pair read: its loop count has one good plan for any values.
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        rows = cursor.fetchall()
    return {
        pairs[place]: (bool(observed), action, bool(by_operator), int(replies), int(count))
        for place, observed, action, by_operator, replies, count in rows
    }


def recent_texts_read(batches: list[tuple[_Batch, list[_Item]]], *, now: Any) -> None:
    """Read, in one query for every batch, the messages the dedupe rule could match (the same text
    from the same sender within the window), and give each batch its own."""
    if settings.SWITCHBOARD_DEDUPE_SECONDS <= 0:
        return
    owner: dict[str, _Batch] = {}
    for batch, items in batches:
        for item in items:
            if item.sha256:
                owner[dedupe_key(batch.sender.id, item.sha256)] = batch
    if not owner:
        return
    keys = sorted(owner)
    since = now - timedelta(seconds=settings.SWITCHBOARD_DEDUPE_SECONDS)
    if connection.vendor == "postgresql":
        # One index probe per text (`message_dedupe_key`), the keys as one array. The sender is
        # in the key, not a condition of its own: the planner could otherwise read every message
        # the sender wrote within the window (`message_sender_recent`) for each text, which it
        # chose whenever its statistics took the sender for a rare one. Prepared like the send's
        # other statements: a generic plan, made without knowing the array's length, probes the
        # same index text by text (tests/messaging/test_pair_facts.py).
        with connection.cursor() as cursor:
            cursor.execute(RECENT_TEXTS_SQL, [keys, MessageKind.TEXT, since])
            matches = cursor.fetchall()
    else:
        # The texts by `message_dedupe_key` first (CROSS JOIN: SQLite joins in the order
        # written), then each one's delivery by its message.
        sql = RECENT_TEXTS_SQLITE.format(keys=", ".join(["%s"] * len(keys)))
        created_at = Message._meta.get_field("created_at").get_db_prep_value(since, connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, [*keys, MessageKind.TEXT.value, created_at])
            matches = cursor.fetchall()
    found: dict[_Batch, list[tuple[str, Any, int]]] = {}
    for sha256, recipient_id, pk, key in matches:
        found.setdefault(owner[key], []).append((sha256, as_uuid(recipient_id), pk))
    for batch, texts in found.items():
        batch.recent_texts_kept(texts)


# PostgreSQL: (text SHA-256, recipient id, delivery id, dedupe key) of the texts within the dedupe
# window, oldest first; parameters: the texts' dedupe keys as an array, the kind, the window's start.
# The statement fixes its plan's shape whatever the statistics say: for each key, a range of
# `message_dedupe_key`'s own key (the only index that can serve it), then each match's delivery by
# its message. Both lookups are LATERAL subqueries behind OFFSET 0, which the planner runs as
# written instead of joining the tables in an order of its own (a flat join may be planned from
# the delivery table outwards, reading every delivery in the window for every text).
RECENT_TEXTS_SQL = (
    "SELECT m.sha256, d.recipient_id, d.id, m.dedupe_key FROM unnest(%s::text[]) AS h(dedupe_key) "
    f"CROSS JOIN LATERAL (SELECT m.id, m.dedupe_key, m.sha256, m.created_at FROM {Message._meta.db_table} m "
    "WHERE m.kind = %s AND (m.dedupe_key, m.created_at) >= (h.dedupe_key, %s) "
    "AND m.dedupe_key = h.dedupe_key OFFSET 0) AS m "
    f"CROSS JOIN LATERAL (SELECT d.recipient_id, d.id FROM {Delivery._meta.db_table} d "
    "WHERE d.message_id = m.id OFFSET 0) AS d "
    "ORDER BY m.created_at"
)

# SQLite: the same, the keys as parameters of an IN list.
RECENT_TEXTS_SQLITE = (
    f"SELECT m.sha256, d.recipient_id, d.id, m.dedupe_key FROM {Message._meta.db_table} m "
    f"CROSS JOIN {Delivery._meta.db_table} d ON d.message_id = m.id "
    "WHERE m.dedupe_key IN ({keys}) AND m.kind = %s AND m.created_at >= %s "
    "ORDER BY m.created_at"
)


@dataclass
class _Item:
    """One item, checked as far as it can be without the database."""

    fields: dict[str, Any]
    error: SwitchboardError | None = None
    single: bool = False  # sent by `message_send` (a rare path)
    target: str = ""
    text: str = ""
    summary: str = ""
    priority: int = Priority.NORMAL
    key: str | None = None
    fingerprint: str = ""
    sha256: str = ""
    size: int = 0


@dataclass
class _Inbox:
    """What the batch knows of one recipient: read from the database once, then kept up to date
    with what the batch itself adds. None means not read yet."""

    recipient: AgentSession
    checked: SwitchboardError | None = None  # the observer rule's refusal, for every item
    trust: str = HOST_VERIFIED
    override: tuple[str | None, bool] | None = None
    verdicts: dict[bool, Verdict] = field(default_factory=dict)
    unread: int | None = None
    looping_back: bool | None = None  # the recipient has sent the sender the loop threshold
    sent_there: int | None = None  # the sender's recent texts to the recipient, up to the threshold
    holds: int | None = None  # holds waiting for an operator


@dataclass
class _Accepted:
    """A message the batch accepted and has not written yet."""

    outcome: SendOutcome
    resolution: Resolution
    decision: Decision
    actor: Principal


class _Writes:
    """What the batches of one transaction accepted and have not written yet, written together:
    one sender's batch, or the batches of every sender in a group sent together (`messages_send_together`).

    A batch reads a recipient's counts (unread, holds, reply-loop texts) from the database, so
    before it does, the messages that change them are written (`written_for`): those to that
    recipient, and those from it to the reading sender. Every batch then reads what it would have
    read had the batches before it been sent and committed one by one."""

    def __init__(self) -> None:
        self.now = timezone.now()  # every message of the transaction is sent at this time
        self.pending: list[_Accepted] = []
        self.batches: list[_Batch] = []  # whose pins are written with the messages
        # What the transaction accepted, written or not, that changes the facts read before it
        # (`pair_facts_read`): messages queued per recipient, texts per (sender, recipient).
        self.queued_for: Counter[Any] = Counter()
        self.texts_between: Counter[tuple[Any, Any]] = Counter()
        # False once something else was written (a message sent alone, holds expired to make
        # room): the facts read ahead no longer count everything, so each is read again.
        self.facts_current = True

    def accepted(self, accepted: _Accepted) -> None:
        """Add a message to write, and count it."""
        self.pending.append(accepted)
        outcome = accepted.outcome
        if outcome.delivery.state == S.QUEUED:
            self.queued_for[outcome.recipient.id] += 1
        self.texts_between[(outcome.message.sender_id, outcome.recipient.id)] += 1

    def written_for(self, *, recipient_id: Any, reader_id: Any) -> None:
        """Write what is pending when any of it changes what `reader_id` reads of `recipient_id`."""
        for accepted in self.pending:
            to, by = accepted.outcome.recipient.id, accepted.outcome.message.sender_id
            if to == recipient_id or (by == recipient_id and to == reader_id):
                self.write()
                return

    def write(self) -> None:
        """Write the accepted messages, their deliveries, pins and audit events, and announce them
        after the commit: one statement per table, whatever the number of messages and senders."""
        pending, self.pending = self.pending, []
        if pending:
            messages_write(
                [(a.outcome.message, a.outcome.delivery) for a in pending],
                now=self.now,
                audit=[
                    row
                    for a in pending
                    for row in acceptance_audit(
                        actor=a.actor,
                        message=a.outcome.message,
                        delivery=a.outcome.delivery,
                        rule=a.resolution.rule,
                        decision=a.decision,
                    )
                ],
            )
        for batch in self.batches:
            batch.pins_written()
        if not pending:
            return
        # First the recipients' pushes (the events that someone waits for), as a single send does,
        # in one hand-off with the senders' notices. One wake-up per recipient: its sockets pull
        # everything queued. A socket address is written one delivery per task, so each of its
        # deliveries gets its own.
        pushes, woken = [], set()
        for accepted in pending:
            delivery, recipient = accepted.outcome.delivery, accepted.outcome.recipient
            if delivery.state != S.QUEUED:
                continue
            if recipient.peer_address.startswith(UDS_PREFIX) or recipient.id not in woken:
                pushes.append((delivery.pk, recipient))
                woken.add(recipient.id)
        schedule_pushes(
            pushes,
            along_with=[
                Announcement(
                    "message.sent",
                    message_event(a.outcome.message, a.outcome.delivery, a.outcome.recipient),
                    sessions=[a.outcome.message.sender_id],
                )
                for a in pending
            ],
        )


class _Batch:
    """One sender's batch send, item by item, with the database read in bulk and written in bulk
    (with the other senders' batches of its transaction, `writes`)."""

    def __init__(
        self, *, sender: AgentSession, actor: Principal, writes: _Writes, keys_locked: bool = False
    ) -> None:
        self.sender, self.actor = sender, actor
        self.writes = writes
        writes.batches.append(self)
        self.now = writes.now
        self.keys_locked = keys_locked  # its idempotency keys' locks were taken with the group's
        self.results: list[SendOutcome | SwitchboardError] = []
        self.targets: dict[str, tuple[AgentSession, Resolution] | SwitchboardError] = {}
        self.inboxes: dict[Any, _Inbox] = {}
        # idempotency key → (request fingerprint, the message it sent), from before and from the batch
        self.keyed: dict[str, tuple[str, SendOutcome | None, Message]] = {}
        # (text SHA-256, recipient id) → the newest such message within the dedupe window
        self.recent: dict[tuple[str, Any], tuple[Message, Delivery]] = {}
        self.pins: dict[str, AgentSession] = {}  # pins the batch set and has not written yet
        # name key → the id its pin points at in the database (None: no pin), as read with a
        # resolution or written by the batch: a pin that already points there is not written again
        self.pinned: dict[str, Any] = {}
        self.tokens: TokenReservation | None = None
        self.dedupe = settings.SWITCHBOARD_DEDUPE_SECONDS > 0
        # recipient id → the pair's facts, read ahead for the whole transaction (`pair_facts_read`)
        self.facts: dict[Any, tuple[bool, str | None, bool, int, int]] = {}

    def send(self, raw: list[dict[str, Any]]) -> list[SendOutcome | SwitchboardError]:
        items = self.prepared(raw)
        read_ahead([(self, items)], now=self.now)
        return self.send_prepared(items)

    def prepared(self, raw: list[dict[str, Any]]) -> list[_Item]:
        """The items, checked as far as they can be without the database."""
        return [self._prepare(fields) for fields in raw]

    def send_prepared(self, items: list[_Item]) -> list[SendOutcome | SwitchboardError]:
        """Send the items, once the texts they could repeat are read (`recent_texts_read`)."""
        self._load_keys(items)
        for position, item in enumerate(items):
            if item.error is not None:
                self.results.append(item.error)
                continue
            if not item.single and self._needs_single(item):
                item.single = True
            if item.single:
                self._send_single(item)
                continue
            if self.tokens is None:
                self.tokens = self._reserve(items[position:])
            try:
                self.results.append(self._send_one(item))
            except SwitchboardError as exc:
                self.results.append(exc)
        self._tokens_released()
        return self.results

    # --- reading -----------------------------------------------------------------------------

    def _prepare(self, fields: dict[str, Any]) -> _Item:
        """`message_send`'s input checks, in its order; nothing here touches the database."""
        item = _Item(fields=fields, single=bool(fields.get("files")) or not BULK_FIELDS.issuperset(fields))
        if item.single:
            return item
        try:
            checked = send_input_checked(
                to=fields["to"],
                text=fields["text"],
                summary=fields.get("summary") or "",
                priority=fields.get("priority", "normal"),
                idempotency_key=fields.get("idempotency_key"),
                kind=MessageKind.TEXT,
                frame_type="",
            )
        except SwitchboardError as exc:
            item.error = exc
            return item
        item.key = fields.get("idempotency_key")
        item.target, item.text, item.summary, item.priority = (
            checked.target,
            checked.text,
            checked.summary,
            checked.priority,
        )
        item.fingerprint, item.sha256, item.size = checked.fingerprint, checked.sha256, checked.size
        return item

    def _load_keys(self, items: list[_Item]) -> None:
        """Lock every idempotency key of the batch (as `message_send` locks its one), then read
        the earlier sends that used them, in one query."""
        keys = sorted(
            {
                key
                for item in items
                if isinstance(key := item.key or item.fields.get("idempotency_key"), str)
                and 0 < len(key) <= 128
            }
        )
        if not keys:
            return
        if not self.keys_locked:
            idempotency_keys_locked([(self.sender.id, key) for key in keys])
        earlier = {m.id: m for m in Message.objects.filter(sender=self.sender, idempotency_key__in=keys)}
        first: dict[Any, Delivery] = {}
        if earlier:
            deliveries = Delivery.objects.filter(message_id__in=earlier).select_related("recipient")
            for delivery in deliveries.order_by("-id"):  # newest first, so each message's first stays
                first[delivery.message_id] = delivery
        for message in earlier.values():
            assert message.idempotency_key is not None
            delivery = first.get(message.id)
            outcome = delivery and SendOutcome(
                message=message, delivery=delivery, recipient=delivery.recipient
            )
            self.keyed[message.idempotency_key] = (message.request_hash, outcome, message)

    def recent_texts_kept(self, found: list[tuple[str, Any, int]]) -> None:
        """Keep the sender's texts within the dedupe window: (text SHA-256, recipient id, delivery
        id), oldest first, as `recent_texts_read` found them."""
        newest = {(sha256, recipient_id): pk for sha256, recipient_id, pk in found}  # oldest first
        if newest:  # usually none: read the rows only for the texts that are sent again
            rows = Delivery.objects.select_related("message").in_bulk(list(newest.values()))
            for key, pk in newest.items():
                self.recent[key] = (rows[pk].message, rows[pk])

    def _target(self, target: str) -> tuple[AgentSession, Resolution] | SwitchboardError:
        """`resolve_recipient` once per distinct address (its NotFound means: try a federation route)."""
        found = self.targets.get(target)
        if found is None:
            if self.pins:
                self._write()  # resolution reads the sender's pins: write the batch's first
            try:
                recipient, resolution, pinned = resolve_recipient_pinned(self.sender, target)
            except SwitchboardError as exc:
                found = exc
            else:
                found = (recipient, resolution)
                if resolution.pin_key:
                    self.pinned[resolution.pin_key] = pinned
            self.targets[target] = found
        return found

    def resolution_kept(
        self, target: str, found: tuple[AgentSession, Resolution, Any] | SwitchboardError
    ) -> None:
        """Keep whom `target` means, as `recipients_resolved` read it ahead (see `_target`)."""
        if isinstance(found, SwitchboardError):
            self.targets[target] = found
            return
        recipient, resolution, pinned = found
        self.targets[target] = (recipient, resolution)
        if resolution.pin_key:
            self.pinned[resolution.pin_key] = pinned

    def sends_in_bulk_to(self, recipient: AgentSession) -> bool:
        """True when a message to `recipient` takes the bulk path (see the module docstring)."""
        return recipient.status in LIVE and recipient.kind != REMOTE_KIND and recipient.id != self.sender.id

    def _needs_single(self, item: _Item) -> bool:
        """True when the item's address leads off the bulk path (see the module docstring)."""
        if item.key and item.key in self.keyed:
            return False  # answered from the earlier send, whatever the address now means
        found = self._target(item.target)
        if isinstance(found, NotFound):
            return True
        if isinstance(found, SwitchboardError):
            return False
        return not self.sends_in_bulk_to(found[0])

    def _inbox(self, recipient: AgentSession) -> _Inbox:
        inbox = self.inboxes.get(recipient.id)
        if inbox is None:
            inbox = self.inboxes[recipient.id] = _Inbox(recipient=recipient)
            facts = self.facts.get(recipient.id) if self.writes.facts_current else None
            if facts is not None:
                observed = self._facts_kept(inbox, facts, read_ahead=True)
            else:
                self._write_for(inbox)  # another sender's batch of the group may have written to it
                observed = self._read_recipient(inbox)
            if observed:
                # Observers send only observer reports to their target and receive nothing.
                try:
                    trust = PLUGINS.send_guard.check(
                        sender=self.sender, recipient=recipient, kind=MessageKind.TEXT
                    )
                except SwitchboardError as exc:
                    inbox.checked = exc
                else:
                    inbox.trust = trust or HOST_VERIFIED
        return inbox

    def _read_recipient(self, inbox: _Inbox) -> bool:
        """Read in one query what the batch needs of a recipient that no item changes
        (`pair_facts_read`); True when either side is an observer."""
        (facts,) = pair_facts_read([(self.sender.id, inbox.recipient.id)], now=self.now).values()
        return self._facts_kept(inbox, facts, read_ahead=False)

    def _facts_kept(
        self, inbox: _Inbox, facts: tuple[bool, str | None, bool, int, int], *, read_ahead: bool
    ) -> bool:
        """Keep a pair's facts (`pair_facts_read`); when they were read ahead of the transaction's
        writes, with what it accepted since: its messages queued for the recipient, its texts
        from the recipient to this sender. True when either side is an observer."""
        observed, action, by_operator, replies, unread = facts
        if read_ahead:
            replies += self.writes.texts_between[(inbox.recipient.id, self.sender.id)]
            unread += self.writes.queued_for[inbox.recipient.id]
        threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
        inbox.override = (action, bool(by_operator)) if action is not None else (None, False)
        inbox.looping_back = threshold > 0 and replies >= threshold
        inbox.unread = unread
        return observed

    def _reserve(self, items: list[_Item]) -> TokenReservation:
        """Tokens for every item up to the next one sent alone: at most one each."""
        recipients = []
        for item in items:
            if item.error is None and (item.single or self._needs_single(item)):
                item.single = True
                break
            if item.error is None:
                found = self._target(item.target)
                if not isinstance(found, SwitchboardError):
                    recipients.append(found[0].id)
        return limits_reserve(sender=self.sender, recipient_ids=recipients)

    # --- deciding ----------------------------------------------------------------------------

    def _send_one(self, item: _Item) -> SendOutcome:
        """`message_send` for one item on the bulk path, from the idempotency key on."""
        if item.key and item.key in self.keyed:
            return self._earlier(item)
        found = self._target(item.target)
        if isinstance(found, SwitchboardError):
            raise found
        recipient, resolution = found
        reply_checked(self.sender, item.fields.get("in_reply_to"))
        inbox = self._inbox(recipient)
        if inbox.checked is not None:
            raise inbox.checked
        original = self.recent.get((item.sha256, recipient.id)) if self.dedupe else None
        if original is not None:
            return SendOutcome(message=original[0], delivery=original[1], recipient=recipient, duplicate=True)
        assert self.tokens is not None
        self.tokens.spend(recipient)
        self._check_unread(inbox)
        decision = self._decide(item, inbox)
        if decision.state == S.HELD:
            self._make_room(inbox)
        message = accepted_message(
            sender=self.sender,
            recipient=recipient,
            kind=MessageKind.TEXT,
            text=item.text,
            summary=item.summary,
            size=item.size,
            sha256=item.sha256,
            priority=item.priority,
            decision=decision,
            target=item.target,
            idempotency_key=item.key,
            fingerprint=item.fingerprint,
            in_reply_to=item.fields.get("in_reply_to"),
            now=self.now,
        )
        delivery = first_delivery(
            message=message, recipient=recipient, decision=decision, tier=DeliveryTier.HOST, now=self.now
        )
        outcome = SendOutcome(message=message, delivery=delivery, recipient=recipient)
        self.writes.accepted(
            _Accepted(outcome=outcome, resolution=resolution, decision=decision, actor=self.actor)
        )
        self._remember(item.key, item.fingerprint, item.sha256, outcome)
        if resolution.rule == "name_ref" or (resolution.pin_key and resolution.rule != "lead"):
            self._pin(resolution.pin_key, recipient)
        if inbox.sent_there is not None:
            inbox.sent_there += 1
        if decision.state == S.QUEUED and inbox.unread is not None:
            inbox.unread += 1
        if decision.state == S.HELD and inbox.holds is not None:
            inbox.holds += 1
        return outcome

    def _earlier(self, item: _Item) -> SendOutcome:
        """The answer for a key already used: the original send, or a conflict (`_earlier_send`)."""
        assert item.key is not None
        fingerprint, outcome, message = self.keyed[item.key]
        if fingerprint != item.fingerprint:
            raise IdempotencyConflict(
                "That idempotency key was already used for a different message; use a new key for new content.",
                message_id=str(message.id),
            )
        if outcome is None:  # pragma: no cover - a message is always written with its delivery
            raise NotFound("The earlier message has no delivery.")
        return SendOutcome(
            message=outcome.message, delivery=outcome.delivery, recipient=outcome.recipient, duplicate=True
        )

    def _remember(self, key: str | None, fingerprint: str, sha256: str, outcome: SendOutcome) -> None:
        """What later items must see of a message this batch sent: its key and its text."""
        if key:
            self.keyed[key] = (fingerprint, outcome, outcome.message)
        self.recent[(sha256, outcome.recipient.id)] = (outcome.message, outcome.delivery)

    def _check_unread(self, inbox: _Inbox) -> None:
        """The unread cap of `limits_take`: read with the recipient, then counted along (read again
        after something else wrote to its inbox)."""
        if inbox.unread is None:
            self._write_for(inbox)
            inbox.unread = unread_count(inbox.recipient.id)
        if inbox.unread >= settings.SWITCHBOARD_UNREAD_PER_RECIPIENT:
            raise queue_full(inbox.recipient, inbox.unread)

    def _decide(self, item: _Item, inbox: _Inbox) -> Decision:
        """`decide` for a live local recipient, with its reads done once per recipient."""
        recipient = inbox.recipient
        classification = classify(item.text, summary=item.summary, kind=MessageKind.TEXT)
        sensitive = classification.tier == Tier.SENSITIVE
        assert inbox.override is not None  # read with the recipient (`_read_recipient`)
        override, by_operator = inbox.override
        facts = decision_facts(
            sender=self.sender,
            recipient=recipient,
            classification=classification,
            trust=inbox.trust,
            kind=MessageKind.TEXT,
            override=override,
            by_operator=by_operator,
            looping=self._looping(inbox),
            now=self.now,
            verdict=inbox.verdicts.get(sensitive),
        )
        inbox.verdicts[sensitive] = facts.verdict
        return decide(facts)

    def _looping(self, inbox: _Inbox) -> bool:
        """`limits_loop_suspected`, with each direction counted once per batch: the reply direction
        cannot change within it, and the sender's own direction grows by what the batch sends."""
        threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
        if threshold <= 0:
            return False
        if not inbox.looping_back:  # read with the recipient (`_read_recipient`)
            return False
        if inbox.sent_there is None:
            self._write_for(inbox)
            inbox.sent_there = self._texts_sent_there(inbox.recipient, up_to=threshold)
        return inbox.sent_there >= threshold

    def _texts_sent_there(self, recipient: AgentSession, *, up_to: int) -> int:
        """The sender's plain texts to `recipient` within the loop window, counted up to `up_to`."""
        since = self.now - timedelta(seconds=settings.SWITCHBOARD_LOOP_WINDOW_SECONDS)
        sql = f"SELECT COUNT(*) FROM ({pair_texts_sql()}) AS sent"
        params = pair_texts_params(self.sender.id, recipient.id, since=since, limit=up_to)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            (count,) = cursor.fetchone()
        return int(count)

    def _make_room(self, inbox: _Inbox) -> None:
        """`holds_make_room` only when the recipient's holds are at the cap (counted once)."""
        if inbox.holds is None:
            self._write_for(inbox)
            inbox.holds = (
                Delivery.objects.filter(recipient_id=inbox.recipient.id, state=S.HELD)
                .exclude(hold_reason=STOPPED_HOLD)
                .count()
            )
        if inbox.holds < settings.SWITCHBOARD_HOLDS_PER_RECIPIENT:
            return
        self._write()  # the oldest holds may be this batch's own
        moved = holds_make_room(recipient=inbox.recipient)
        inbox.holds -= len(moved)
        if moved:
            self.writes.facts_current = False
        # The expired holds' senders were told with a notification: their unread counts changed.
        for sender_id in {m.sender_id for m in moved}:
            if sender_id in self.inboxes:
                self.inboxes[sender_id].unread = None

    def _pin(self, key: str | None, recipient: AgentSession) -> None:
        """Pin `key` to `recipient` (written with the batch) and forget the resolutions it changes.
        A pin that already points at `recipient` stays as it is: nothing to write, nothing changes."""
        assert key is not None
        pending = self.pins.get(key)
        current = pending.id if pending is not None else self.pinned.get(key, _NOT_READ)
        if current == recipient.id:
            return
        self.pins[key] = recipient
        for target, found in list(self.targets.items()):
            changed = (
                isinstance(found, PinConflict)
                and parse_address(target).key == key
                or isinstance(found, tuple)
                and found[1].rule in PIN_CHECKED_RULES
                and found[1].pin_key == key
                and found[0].id != recipient.id
            )
            if changed:
                del self.targets[target]

    # --- the rare path -----------------------------------------------------------------------

    def _send_single(self, item: _Item) -> None:
        """Send one item with `message_send`, after writing and settling what came before it."""
        self._settle()
        self.writes.facts_current = False  # it may write more than its message
        try:
            outcome = message_send(SendRequest(sender=self.sender, actor=self.actor, **item.fields))
        except SwitchboardError as exc:
            self.results.append(exc)
            return
        self.results.append(outcome)
        for inbox in self.inboxes.values():  # it may have written more than its message: read again
            inbox.unread = None
        if outcome.duplicate:
            return
        message = outcome.message
        if message.idempotency_key:
            self.keyed[message.idempotency_key] = (message.request_hash, outcome, message)
        if message.kind == MessageKind.TEXT:
            self.recent[(message.sha256, outcome.recipient.id)] = (message, outcome.delivery)
        # It may have pinned a name or changed the recipient's counts: read them again when needed.
        self.targets.clear()
        self.pinned.clear()
        self.inboxes.pop(outcome.recipient.id, None)

    def _tokens_released(self) -> None:
        """Give back the rate-limit tokens taken and not spent."""
        if self.tokens is not None:
            self.tokens.release()
            self.tokens = None

    def _settle(self) -> None:
        """Give back the tokens not spent and write everything accepted so far."""
        self._tokens_released()
        self._write()

    # --- writing -----------------------------------------------------------------------------

    def _write_for(self, inbox: _Inbox) -> None:
        """Write what is pending when it changes what this sender reads of `inbox`'s recipient,
        before counting there (`_Writes.written_for`)."""
        self.writes.written_for(recipient_id=inbox.recipient.id, reader_id=self.sender.id)

    def _write(self) -> None:
        """Write everything accepted so far (`_Writes.write`)."""
        self.writes.write()

    def pins_written(self) -> None:
        """Write the pins the batch set, with its messages."""
        pins, self.pins = self.pins, {}
        for key, recipient in pins.items():
            Pin.objects.update_or_create(sender=self.sender, name_key=key, defaults={"recipient": recipient})
            self.pinned[key] = recipient.id
