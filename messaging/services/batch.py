"""Batch sends in bulk: many messages from one sender, each with the outcome a single send gives.

`messages_send_batch` runs each item through the rules of `message_send` (validation, the
idempotency key, resolution and pins, dedupe, rate limits and the unread cap, policy, loop
protection), but it asks the database each question once per batch (per distinct address or
recipient) and keeps what the earlier items changed in memory, then writes the messages, their
deliveries and their audit events with one statement per table.

The common case (a live local recipient, plain text) takes this bulk path. An item that needs a
rare path (attached files, an address no local session takes — a federation route —, a stopped
or remote recipient, a session messaging itself, a field the bulk path does not know) is sent with
`message_send` itself, in order: what the batch has accepted so far is written first, so that send
sees exactly what it would have seen after the earlier items were sent one by one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from messaging.addressing import Resolution, parse_address
from messaging.errors import IdempotencyConflict, Invalid, NotFound, PinConflict, SwitchboardError
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
from messaging.policy import ACCEPT, HOLD, HOST_VERIFIED, REFUSE, Verdict
from messaging.principals import Principal, session_principal
from messaging.sensitivity import classify
from messaging.services.events import Announcement
from messaging.services.holds import STOPPED_HOLD, hold_expiry_for, holds_make_room
from messaging.services.limits import (
    TokenReservation,
    limits_reserve,
    queue_full,
    unread_count,
)
from messaging.services.pair import dedupe_key, pair_texts_params, pair_texts_sql
from messaging.services.sending import (
    LIVE_STATUSES,
    Decision,
    SendOutcome,
    acceptance_audit,
    accepted_message,
    first_delivery,
    idempotency_lock_id,
    inbound_verdict,
    message_event,
    message_send,
    messages_write,
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
    """Send many messages in one request. Each item holds `message_send`'s keyword arguments (to,
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
        return _Batch(sender=sender, actor=actor or session_principal(sender)).send(items)


# PostgreSQL: (text SHA-256, recipient id, delivery id) of the sender's texts within the dedupe
# window, oldest first; parameters: the texts' dedupe keys as an array, the kind, the window's start.
# The statement fixes its plan's shape whatever the statistics say: for each key, a range of
# `message_dedupe_key`'s own key (the only index that can serve it), then each match's delivery by
# its message. Both lookups are LATERAL subqueries behind OFFSET 0, which the planner runs as
# written instead of joining the tables in an order of its own. Written as one flat join, it was
# planned from the delivery table outwards whenever the statistics took the tables for empty (an
# ANALYZE while they held no live rows, until the next): every delivery against every text,
# each by the `created_at` index, 24 s for one batch at 1,200 messages.
RECENT_TEXTS_SQL = (
    "SELECT m.sha256, d.recipient_id, d.id FROM unnest(%s::text[]) AS h(dedupe_key) "
    f"CROSS JOIN LATERAL (SELECT m.id, m.sha256, m.created_at FROM {Message._meta.db_table} m "
    "WHERE m.kind = %s AND (m.dedupe_key, m.created_at) >= (h.dedupe_key, %s) "
    "AND m.dedupe_key = h.dedupe_key OFFSET 0) AS m "
    f"CROSS JOIN LATERAL (SELECT d.recipient_id, d.id FROM {Delivery._meta.db_table} d "
    "WHERE d.message_id = m.id OFFSET 0) AS d "
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


class _Batch:
    """One batch send, item by item, with the database read in bulk and written in bulk."""

    def __init__(self, *, sender: AgentSession, actor: Principal) -> None:
        self.sender, self.actor = sender, actor
        self.now = timezone.now()
        self.results: list[SendOutcome | SwitchboardError] = []
        self.targets: dict[str, tuple[AgentSession, Resolution] | SwitchboardError] = {}
        self.inboxes: dict[Any, _Inbox] = {}
        # idempotency key → (request fingerprint, the message it sent), from before and from the batch
        self.keyed: dict[str, tuple[str, SendOutcome | None, Message]] = {}
        # (text SHA-256, recipient id) → the newest such message within the dedupe window
        self.recent: dict[tuple[str, Any], tuple[Message, Delivery]] = {}
        self.pending: list[_Accepted] = []
        self.pins: dict[str, AgentSession] = {}  # pins the batch set and has not written yet
        # name key → the id its pin points at in the database (None: no pin), as read with a
        # resolution or written by the batch: a pin that already points there is not written again
        self.pinned: dict[str, Any] = {}
        self.tokens: TokenReservation | None = None
        self.dedupe = settings.SWITCHBOARD_DEDUPE_SECONDS > 0

    def send(self, raw: list[dict[str, Any]]) -> list[SendOutcome | SwitchboardError]:
        items = [self._prepare(fields) for fields in raw]
        self._load_keys(items)
        self._load_recent(items)
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
        self._settle()
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
        if connection.vendor == "postgresql":
            # The same lock ids as a single send's, taken in one order so two batches never deadlock.
            locks = sorted({idempotency_lock_id(sender_id=str(self.sender.id), key=key) for key in keys})
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(id) FROM unnest(%s::bigint[]) AS id", [locks])
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

    def _load_recent(self, items: list[_Item]) -> None:
        """Read the messages the dedupe rule could match (same text, within the window), in one query."""
        hashes = sorted({item.sha256 for item in items if item.sha256})
        if not self.dedupe or not hashes:
            return
        since = self.now - timedelta(seconds=settings.SWITCHBOARD_DEDUPE_SECONDS)
        keys = [dedupe_key(self.sender.id, sha256) for sha256 in hashes]
        if connection.vendor == "postgresql":
            # One index probe per text (`message_dedupe_key`), the keys as one array. The sender is
            # in the key, not a condition of its own: the planner could otherwise read every
            # message the sender wrote within the window (`message_sender_recent`) for each text,
            # which it chose whenever its statistics took the sender for a rare one (a new sender,
            # or any before the table's first ANALYZE): 23 ms per batch of 100 instead of 1.
            # Prepared like the send's other statements: a generic plan, made without knowing the
            # array's length, probes the same index text by text (tests/messaging/test_pair_facts.py).
            with connection.cursor() as cursor:
                cursor.execute(RECENT_TEXTS_SQL, [keys, MessageKind.TEXT, since])
                matches = cursor.fetchall()
        else:
            matches = list(
                Delivery.objects.filter(
                    message__dedupe_key__in=keys,
                    message__kind=MessageKind.TEXT,
                    message__created_at__gte=since,
                )
                .order_by("message__created_at")
                .values_list("message__sha256", "recipient_id", "pk")
            )
        newest = {(sha256, recipient_id): pk for sha256, recipient_id, pk in matches}  # oldest first
        if newest:  # usually none: read the rows only for the texts that are sent again
            found = Delivery.objects.select_related("message").in_bulk(list(newest.values()))
            for key, pk in newest.items():
                self.recent[key] = (found[pk].message, found[pk])

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

    def _needs_single(self, item: _Item) -> bool:
        """True when the item's address leads off the bulk path (see the module docstring)."""
        if item.key and item.key in self.keyed:
            return False  # answered from the earlier send, whatever the address now means
        found = self._target(item.target)
        if isinstance(found, NotFound):
            return True
        if isinstance(found, SwitchboardError):
            return False
        recipient = found[0]
        return (
            recipient.status not in LIVE_STATUSES
            or recipient.kind == REMOTE_KIND
            or recipient.id == self.sender.id
        )

    def _inbox(self, recipient: AgentSession) -> _Inbox:
        inbox = self.inboxes.get(recipient.id)
        if inbox is None:
            inbox = self.inboxes[recipient.id] = _Inbox(recipient=recipient)
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
        """Read in one query what the batch needs of a recipient that no item changes: whether
        either side is an observer (returned), its rule for this sender, whether it has sent the
        sender the loop threshold of texts within the window, and its unread count (the counts the
        database keeps, models.UnreadCount). Separately they are four round trips per recipient."""
        restricted, policy = PLUGINS.send_guard.restricted_sql, SenderPolicy._meta.db_table
        unread = UnreadCount._meta.db_table
        ident = functools.partial(Message._meta.pk.get_db_prep_value, connection=connection)
        threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
        since = self.now - timedelta(seconds=settings.SWITCHBOARD_LOOP_WINDOW_SECONDS)
        sender, recipient = ident(self.sender.id), ident(inbox.recipient.id)
        sql = f"""
            SELECT
              ({restricted} OR {restricted}),
              (SELECT action FROM {policy} WHERE recipient_id = %s AND sender_id = %s),
              (SELECT by_operator FROM {policy} WHERE recipient_id = %s AND sender_id = %s),
              (SELECT COUNT(*) FROM ({pair_texts_sql()}) AS replies),
              (SELECT COALESCE(SUM(n), 0) FROM {unread} WHERE recipient_id = %s)
        """
        params = [sender, recipient, recipient, sender, recipient, sender]
        params += pair_texts_params(inbox.recipient.id, self.sender.id, since=since, limit=max(threshold, 1))
        params += [recipient]
        # Prepared like the single send's pair read: its loop count has one good plan for any values.
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            observed, action, by_operator, replies, unread = cursor.fetchone()
        inbox.override = (action, bool(by_operator)) if action is not None else (None, False)
        inbox.looping_back = threshold > 0 and replies >= threshold
        inbox.unread = int(unread)  # nothing of this batch is written for it yet
        return bool(observed)

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
        self.pending.append(_Accepted(outcome=outcome, resolution=resolution, decision=decision))
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
        """`decide_inbound` for a live local recipient, with its reads done once per recipient."""
        recipient = inbox.recipient
        classification = classify(item.text, summary=item.summary, kind=MessageKind.TEXT)
        tier = classification.tier
        sensitive = tier == Tier.SENSITIVE
        assert inbox.override is not None  # read with the recipient (`_read_recipient`)
        override, by_operator = inbox.override
        verdict = inbox.verdicts.get(sensitive)
        if verdict is None:
            verdict = inbox.verdicts[sensitive] = inbound_verdict(
                sender=self.sender,
                recipient=recipient,
                sensitive=sensitive,
                trust=inbox.trust,
                override=override,
                by_operator=by_operator,
            )
        marks = {
            "tier": tier,
            "trust": inbox.trust,
            "escalate": verdict.escalate,
            "sensitivity": classification if classification.matches else None,
        }
        if verdict.action == REFUSE:
            return Decision(state=S.REFUSED, reason=f"inbound policy: {verdict.reason}", **marks)
        if verdict.action == HOLD:
            expires = hold_expiry_for(recipient, self.now)
            return Decision(state=S.HELD, hold_reason=verdict.reason, expires_at=expires, **marks)
        # An operator's explicit allow for this pair says the human has seen them talk: no loop hold.
        if not (override == ACCEPT and by_operator) and self._looping(inbox):
            expires = hold_expiry_for(recipient, self.now)
            return Decision(state=S.HELD, hold_reason="loop_suspected", expires_at=expires, **marks)
        return Decision(state=S.QUEUED, **marks)

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
        try:
            outcome = message_send(sender=self.sender, actor=self.actor, **item.fields)
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

    def _settle(self) -> None:
        """Give back the tokens not spent and write everything accepted so far."""
        if self.tokens is not None:
            self.tokens.release()
            self.tokens = None
        self._write()

    # --- writing -----------------------------------------------------------------------------

    def _write_for(self, inbox: _Inbox) -> None:
        """Write what is pending when some of it is for `inbox`'s recipient, before counting there."""
        if any(a.outcome.recipient.id == inbox.recipient.id for a in self.pending):
            self._write()

    def _write(self) -> None:
        """Write the accepted messages, their deliveries, pins and audit events, and announce them
        after the commit: one statement per table, whatever the number of messages."""
        pending, self.pending = self.pending, []
        pins, self.pins = self.pins, {}
        if pending:
            messages_write(
                [(a.outcome.message, a.outcome.delivery) for a in pending],
                now=self.now,
                audit=[
                    row
                    for a in pending
                    for row in acceptance_audit(
                        actor=self.actor,
                        message=a.outcome.message,
                        delivery=a.outcome.delivery,
                        rule=a.resolution.rule,
                        decision=a.decision,
                    )
                ],
            )
        for key, recipient in pins.items():
            Pin.objects.update_or_create(sender=self.sender, name_key=key, defaults={"recipient": recipient})
            self.pinned[key] = recipient.id
        if not pending:
            return
        # First the recipients' pushes (the events that someone waits for), as a single send does,
        # in one hand-off with the sender's notices. One wake-up per recipient: its sockets pull
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
                    sessions=[self.sender.id],
                )
                for a in pending
            ],
        )
