"""The send pipeline: one message or many, from one sender or many, each with the outcome it
would have had sent on its own.

Every send is a `SendRequest` and goes through the same steps, in this order:

1. check: the input, with no database (`sending.send_input_checked`);
2. resolve: whom the address means, against the sender's pin for the name (by a unique prefix
   too, unless another hub this hub does not vouch for forwarded it: `Origin.exact_address_only`);
   an address no local session takes is tried on the other hubs
   (`messaging.plugins.OtherHubs.route`) unless the message was forwarded here;
3. guard: no self-sends, replies only to the sender's own messages, the observer rule, the dedupe
   window, the rate limits, the recipient's unread cap and the sender's share of it (a hub-made
   message skips the last four);
   a message to be held makes room only among its own sender's holds (`holds.holds_make_room`);
4. decide: `decision.decide`, a pure function over the pair's facts (or the route's own decision
   for a message that leaves this hub), adjusted by the forwarding hub's standing;
5. write: messages, deliveries and audit events (one statement per table, `sending.messages_write`),
   pins, attached files and routes, then the recipients' pushes and the senders' notices after
   the commit;
6. outcome: a `SendOutcome`, or the error a send raises, in the request's place;
7. hand over: after the commit, on the sender's own thread, what went to other hubs is handed over
   (`outcomes_handed_over`: to the relay, or to a channel or LAN hub), so the sender is answered
   what became of it (`failed` with the reason when the hub or the relay refused it).

`message_send` is a batch of one; `messages_send_batch` is one sender's many; `messages_send` is any
senders' (the hub's group commit, `together`). The database is asked each question once for all the
requests (`read_ahead`: the earlier sends their idempotency keys name, the texts they could repeat,
whom their addresses mean, each pair's facts), and what the earlier requests changed is kept in
memory (`_Writes`, `_Inbox`), so every request sees what it would have seen had the ones before it
been sent and committed one by one. A batch of one reads what a lone send needs: its address, then
every fact of its pair in one statement (`pair.pair_facts`). The writes of a group share one
transaction (a database failure commits none); a single send on PostgreSQL that writes only its
message needs none, its write being one statement.
"""

from __future__ import annotations

import contextlib
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
from messaging.hold_reasons import STOPPED_HOLD
from messaging.models import (
    AgentSession,
    Delivery,
    DeliveryTier,
    Message,
    MessageKind,
    Pin,
    Priority,
    SenderPolicy,
    Tier,
)
from messaging.plugins import PLUGINS, RemoteSend
from messaging.policy import Verdict
from messaging.principals import Principal, session_principal
from messaging.sensitivity import Classification, classify
from messaging.services.bulk import as_uuid
from messaging.services.decision import Decision, decide
from messaging.services.delivery import told_of_moves, told_of_moves_is
from messaging.services.events import Announcement
from messaging.services.holds import holds_counted, holds_make_room, holds_over
from messaging.services.limits import (
    UNREAD_SHARE_SQL,
    UNREAD_SQL,
    TokenReservation,
    limits_reserve,
    queue_full,
    unread_counted,
    unread_share_full,
)
from messaging.services.locks import lock_id, locks_taken
from messaging.services.pair import dedupe_key, pair_facts, pair_texts_params, pair_texts_sql
from messaging.services.recipients import (
    PIN_CHECKED_RULES,
    pin_check,
    pin_key_checked,
    recipients_resolved,
    resolve_address,
    resolve_recipient_pinned,
)
from messaging.services.request import SendRequest
from messaging.services.sending import (
    SendOutcome,
    acceptance_audit,
    accepted_message,
    decision_facts,
    files_scanned,
    first_delivery,
    message_event,
    messages_write,
    reply_checked,
    send_input_checked,
    stopped_holds_checked,
)
from messaging.services.transports import UDS_PREFIX, schedule_pushes
from messaging.states import DeliveryState

S = DeliveryState
BATCH_MAX = 1000
_NOT_READ = object()  # a pin the batch has not read: written whatever it points at


def message_send(request: SendRequest) -> SendOutcome:
    """Send one request through the pipeline (a batch of one); raise the error it meets. Answers
    only after the message and its delivery are committed (and, for another hub, handed to it or
    to the relay: step 7). See the module docstring for the steps:
    uploaded files are scanned by their first bytes with the text and the summary
    (`messaging.sensitivity.FILE_SCAN_BYTES`); an address no local session (live or stopped) takes
    is tried on the other hubs (channel → LAN → relay) before it is `not_found`, unless the message
    was forwarded here."""
    [outcome] = messages_send([request])
    if isinstance(outcome, SwitchboardError):
        raise outcome
    outcomes_handed_over([outcome])
    return outcome


def messages_send_batch(
    *, sender: AgentSession, items: list[dict[str, Any]], actor: Principal | None = None
) -> list[SendOutcome | SwitchboardError]:
    """Send many messages in one request: each item holds a `SendRequest`'s fields (to, text,
    summary, idempotency_key, priority, in_reply_to, files) and gets the outcome a single send
    would, or the error it would raise, in its place; the others go on. One transaction: the
    answer comes only after every accepted item is committed (a database failure accepts none)."""
    if not items:
        raise Invalid("empty_batch", "A batch needs at least one message.")
    if len(items) > BATCH_MAX:
        raise Invalid("batch_too_large", f"A batch takes at most {BATCH_MAX} messages; split it.")
    outcomes = messages_send([SendRequest(sender=sender, actor=actor, **fields) for fields in items])
    outcomes_handed_over(outcomes)
    return outcomes


def messages_send(requests: list[SendRequest]) -> list[SendOutcome | SwitchboardError]:
    """Send requests from any senders, each with the outcome it would have had on its own, in the
    order given: each sender's requests go as one batch (in their order, so a pair's messages keep
    theirs), the senders one after another as they first appear, and all their messages are written
    together. More than one request, or one with an idempotency key, share one transaction from the
    first read; the answer comes only after the lot is committed."""
    # One batch per sender, actor and address rule (`Origin.exact_address_only`): a batch
    # resolves every address it holds by one rule.
    by_sender: dict[tuple[Any, str, bool], list[int]] = {}
    actors = [request.actor or session_principal(request.sender) for request in requests]
    for position, (request, actor) in enumerate(zip(requests, actors, strict=True)):
        key = (request.sender.id, actor.actor, request.origin.exact_address_only)
        by_sender.setdefault(key, []).append(position)
    results: list[SendOutcome | SwitchboardError | None] = [None] * len(requests)
    with contextlib.ExitStack() as stack:
        writes = _Writes(stack)
        batches = []
        for positions in by_sender.values():
            first = positions[0]
            batch = _Batch(
                sender=requests[first].sender,
                actor=actors[first],
                writes=writes,
                prefixes=not requests[first].origin.exact_address_only,
            )
            batches.append((batch, positions, batch.prepared([requests[p] for p in positions])))
        keys = [(batch.sender.id, item.key) for batch, _p, items in batches for item in items if item.key]
        if len(requests) > 1 or keys:
            writes.transaction()
            idempotency_keys_locked(keys)
        for batch, _positions, items in batches:
            batch.earlier_sends_read(items)
        read_ahead([(batch, items) for batch, _positions, items in batches], now=writes.now)
        for batch, positions, items in batches:
            for position, result in zip(positions, batch.send_prepared(items), strict=True):
                results[position] = result
        writes.write()
    assert all(result is not None for result in results)
    return results  # type: ignore[return-value]


def outcomes_handed_over(outcomes: list[SendOutcome | SwitchboardError]) -> None:
    """Step 7: hand the deliveries these sends relayed to other hubs over now
    (`OtherHubs.hand_over`), then take each one's state as it is afterwards, so the answer never
    names a state the delivery already left. Only after the send's commit, on the sender's own
    thread: never inside `messages_send`, whose group of sends would wait on another hub."""
    relayed = {
        outcome.delivery.pk: outcome
        for outcome in outcomes
        if isinstance(outcome, SendOutcome) and not outcome.duplicate and outcome.delivery.state == S.RELAYED
    }
    if not relayed:
        return
    PLUGINS.other_hubs.hand_over(delivery_ids=list(relayed))
    # Re-routed to another hub on the way (the relay or hub knew no such agent), a delivery has another
    # tier and recipient (that hub's stand-in), which the answer names too.
    for now in Delivery.objects.filter(pk__in=list(relayed)).select_related("recipient"):
        outcome = relayed[now.pk]
        outcome.delivery.state, outcome.delivery.decision_reason = now.state, now.decision_reason
        outcome.delivery.tier = now.tier
        if now.recipient_id != outcome.recipient.pk:
            outcome.delivery.recipient = outcome.recipient = now.recipient


def idempotency_keys_locked(keys: list[tuple[Any, str]]) -> None:
    """Lock (sender id, idempotency key) pairs until the transaction ends, so a retry that races
    the original (a client timing out and sending again) always gets the original's answer, never
    a rate limit or a copy. PostgreSQL: advisory locks, taken in one order so two groups (in two
    web processes) that share keys never wait on each other in a cycle; SQLite's IMMEDIATE
    transaction already serializes every writer."""
    locks_taken(lock_id(str(sender_id), key) for sender_id, key in keys)


def read_ahead(batches: list[tuple[_Batch, list[_Item]]], *, now: Any) -> None:
    """What the batches of one transaction read before they send, in a few queries for all of
    them: the texts they could repeat, whom their addresses mean (with the senders' pins), and
    the facts of each sender → recipient pair. Each batch gets its own: what one sender's
    batch writes changes none of it for another but the counts that `_Writes` keeps. A lone
    request reads its pair's facts, its pin and the text it could repeat in one statement."""
    sending = [
        (batch, item)
        for batch, items in batches
        for item in items
        if item.error is None and not (item.key and item.key in batch.keyed)
    ]
    if len(sending) == 1:
        batch, item = sending[0]
        batch.read_alone(item)
        return
    recent_texts_read(batches, now=now)
    wanted = {(batch.sender.id, item.target, batch.prefixes): (batch, item.target) for batch, item in sending}
    if not wanted:
        return
    found = recipients_resolved([(batch.sender, target, batch.prefixes) for batch, target in wanted.values()])
    pairs = []
    for key, (batch, target) in wanted.items():
        batch.resolution_kept(target, found[key])
        if isinstance(found[key], tuple) and found[key][0].id != batch.sender.id:
            pairs.append((batch, found[key][0].id))
    facts = pair_facts_read([(batch.sender.id, recipient_id) for batch, recipient_id in pairs], now=now)
    for batch, recipient_id in pairs:
        batch.facts[recipient_id] = facts[(batch.sender.id, recipient_id)]


def pair_facts_read(pairs: list[tuple[Any, Any]], *, now: Any) -> dict[tuple[Any, Any], PairRead]:
    """Per (sender id, recipient id), in one query for all: whether either is an observer, the
    recipient's rule for the sender (action, set by an operator), the recipient's texts to the
    sender within the loop window (counted up to the threshold), the recipient's unread count and
    the sender's share of it (the counts the database keeps, models.UnreadCount and UnreadShare);
    the sender's own texts there are left to be counted when a loop needs them (None). Separately
    they are five round trips per pair; none of them changes with what a batch sends but the
    counts (see `_Writes`)."""
    pairs = list(dict.fromkeys(pairs))
    if not pairs:
        return {}
    restricted, policy = PLUGINS.send_guard.restricted_sql, SenderPolicy._meta.db_table
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
              {UNREAD_SQL},
              {UNREAD_SHARE_SQL}
            """
        )
        sender, recipient = ident(sender_id), ident(recipient_id)
        params += [sender, recipient, recipient, sender, recipient, sender]
        params += pair_texts_params(recipient_id, sender_id, since=since, limit=max(threshold, 1))
        params += [recipient, recipient, sender]
    # Prepared like the single send's pair read: its loop count has one good plan for any values.
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        rows = cursor.fetchall()
    return {
        pairs[place]: (bool(observed), action, bool(by_operator), int(replies), int(count), int(own), None)
        for place, observed, action, by_operator, replies, count, own in rows
    }


def recent_texts_read(batches: list[tuple[_Batch, list[_Item]]], *, now: Any) -> None:
    """Read, in one query for every batch, the messages the dedupe rule could match (the same text
    from the same sender within the window), and give each batch its own."""
    if settings.SWITCHBOARD_DEDUPE_SECONDS <= 0:
        return
    owner: dict[str, _Batch] = {}
    for batch, items in batches:
        for item in items:
            if item.dedupes:
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
    """One request, checked as far as it can be without the database."""

    request: SendRequest
    error: SwitchboardError | None = None
    target: str = ""
    text: str = ""
    summary: str = ""
    priority: int = Priority.NORMAL
    key: str | None = None
    fingerprint: str = ""
    sha256: str = ""
    size: int = 0

    @property
    def dedupes(self) -> bool:
        """True when the dedupe window applies: a plain text an agent (not the hub) sends."""
        return (
            self.error is None and self.request.kind == MessageKind.TEXT and not self.request.origin.hub_made
        )


# A pair's facts as read ahead (`pair_facts_read`, or a lone send's `pair_facts`): either side an
# observer, the recipient's rule for the sender (action, set by an operator), the recipient's texts
# to the sender within the loop window (up to the threshold), the recipient's unread count, the
# sender's share of it, and the sender's texts to the recipient within the window when they were
# counted with the rest (None: counted when a loop needs them, `_Batch._looping`).
PairRead = tuple[bool, str | None, bool, int, int, int, int | None]


@dataclass
class _Inbox:
    """What the batch knows of one recipient: read from the database once, then kept up to date
    with what the batch itself adds. None means not read yet."""

    recipient: AgentSession
    observed: bool = False  # either side is an observer: the guard checks every message
    override: tuple[str | None, bool] | None = None
    verdicts: dict[tuple[bool, str], Verdict] = field(default_factory=dict)  # by (sensitive, trust)
    unread: int | None = None
    unread_own: int | None = None  # of `unread`, the batch's sender's (read with it)
    looping_back: bool | None = None  # the recipient has sent the sender the loop threshold
    sent_there: int | None = None  # the sender's recent texts to the recipient, up to the threshold
    # Holds waiting for an operator that the batch's holds share the cap with (`holds_counted`):
    # one kind for the whole batch, as only a forwarded message, always sent alone, is held for
    # its hub (`PEER_HOLDS`).
    holds: int | None = None
    own_holds: int | None = None  # of those, the batch's sender's (counted with `holds`)


@dataclass
class _Accepted:
    """A message the pipeline accepted and has not written yet, with what is written beside it."""

    outcome: SendOutcome
    resolution: Resolution
    decision: Decision
    actor: Principal
    route: RemoteSend | None = None


class _Writes:
    """What the batches of one send accepted and have not written yet, written together: one
    sender's batch, or the batches of every sender of a group (`messages_send`).

    A batch reads a recipient's counts (unread, holds, reply-loop texts) from the database, so
    before it does, the messages that change them are written (`written_for`): those to that
    recipient, and those from it to the reading sender. Every batch then reads what it would have
    read had the batches before it been sent and committed one by one.

    Every write runs in one transaction, opened at the first write (or before the first read, by
    `messages_send`) and committed when the send ends (`stack`); the exception is a lone message on
    PostgreSQL with nothing written beside it, whose one statement commits on its own."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.now = timezone.now()  # every message of the send is sent at this time
        self._stack = stack
        self._in_transaction = False
        self.pending: list[_Accepted] = []
        self.batches: list[_Batch] = []  # whose pins are written with the messages
        # What the send accepted, written or not, that changes the facts read before it
        # (`pair_facts_read`): messages queued per recipient and per (sender, recipient), texts
        # per (sender, recipient).
        self.queued_for: Counter[Any] = Counter()
        self.queued_between: Counter[tuple[Any, Any]] = Counter()
        self.texts_between: Counter[tuple[Any, Any]] = Counter()
        # False once something else was written (holds expired to make room): the facts read
        # ahead no longer count everything, so each is read again.
        self.facts_current = True

    def transaction(self) -> None:
        """Open the send's transaction, once; inside the caller's, a savepoint of it."""
        if not self._in_transaction:
            self._stack.enter_context(transaction.atomic())
            self._in_transaction = True

    def accepted(self, accepted: _Accepted) -> None:
        """Add a message to write, and count it."""
        self.pending.append(accepted)
        outcome = accepted.outcome
        if outcome.delivery.state == S.QUEUED:
            self.queued_for[outcome.recipient.id] += 1
            self.queued_between[(outcome.message.sender_id, outcome.recipient.id)] += 1
        if outcome.message.kind == MessageKind.TEXT:
            self.texts_between[(outcome.message.sender_id, outcome.recipient.id)] += 1

    def written_for(self, *, recipient_id: Any, reader_id: Any) -> None:
        """Write what is pending when any of it changes what `reader_id` reads of `recipient_id`."""
        for accepted in self.pending:
            to, by = accepted.outcome.recipient.id, accepted.outcome.message.sender_id
            if to == recipient_id or (by == recipient_id and to == reader_id):
                self.write()
                return

    def write(self) -> None:
        """Write the accepted messages, their deliveries, audit events, routes and pins, and
        announce them after the commit: one statement per table, whatever the number of messages
        and senders."""
        pending, self.pending = self.pending, []
        pins = any(batch.pins for batch in self.batches)
        if not pending and not pins:
            return
        alone = (
            connection.vendor == "postgresql"
            and not connection.in_atomic_block
            and not pins
            and len(pending) == 1
            and pending[0].route is None
        )
        if not alone:
            self.transaction()
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
        for a in pending:
            if a.route is not None:
                a.route.attach(a.outcome.delivery)
        for batch in self.batches:
            batch.pins_written()
        if not pending:
            return
        # First the recipients' pushes (the events that someone waits for), in one hand-off with
        # the senders' notices. One wake-up per recipient: its sockets pull everything queued. A
        # socket address is written one delivery per task, so each of its deliveries gets its own.
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
                    sessions=[told] if (told := told_of_moves(a.outcome.message)) else [],
                )
                for a in pending
            ],
        )


class _Batch:
    """One sender's requests, item by item, with the database read in bulk and written in bulk
    (with the other senders' batches of its send, `writes`)."""

    def __init__(self, *, sender: AgentSession, actor: Principal, writes: _Writes, prefixes: bool) -> None:
        self.sender, self.actor = sender, actor
        # Whether an address may name a session by a unique prefix: False for a message from a
        # hub this hub does not vouch for (`Origin.exact_address_only`), for every item.
        self.prefixes = prefixes
        self.writes = writes
        writes.batches.append(self)
        self.now = writes.now
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
        # recipient id → the pair's facts, read ahead for the whole send (`read_ahead`)
        self.facts: dict[Any, PairRead] = {}

    def prepared(self, requests: list[SendRequest]) -> list[_Item]:
        """The items, checked as far as they can be without the database."""
        return [self._prepare(request) for request in requests]

    def send_prepared(self, items: list[_Item]) -> list[SendOutcome | SwitchboardError]:
        """Send the items, once what they need was read ahead (`read_ahead`)."""
        for position, item in enumerate(items):
            if item.error is not None:
                self.results.append(item.error)
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

    def _prepare(self, request: SendRequest) -> _Item:
        """The input checks of step 1, in the order a sender meets them; no database."""
        item = _Item(request=request)
        try:
            checked = send_input_checked(
                to=request.to,
                text=request.text,
                summary=request.summary or "",
                priority=request.priority,
                idempotency_key=request.idempotency_key,
                kind=request.kind,
                frame_type=request.frame_type,
            )
        except SwitchboardError as exc:
            item.error = exc
            return item
        item.key = request.idempotency_key
        item.target, item.text, item.summary, item.priority = (
            checked.target,
            checked.text,
            checked.summary,
            checked.priority,
        )
        item.fingerprint, item.sha256, item.size = checked.fingerprint, checked.sha256, checked.size
        return item

    def earlier_sends_read(self, items: list[_Item]) -> None:
        """Read the earlier sends the batch's idempotency keys name, in one query (their locks are
        held: `idempotency_keys_locked`)."""
        keys = sorted({item.key for item in items if item.key})
        if not keys:
            return
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

    def read_alone(self, item: _Item) -> None:
        """Read what a lone request needs: whom its address means, then its pair's facts, its pin
        and the earlier copy of its text, in one statement (`pair_facts`)."""
        try:
            recipient, resolution = resolve_address(self.sender, item.target, prefixes=self.prefixes)
        except SwitchboardError as exc:
            self.targets[item.target] = exc
            return
        self.targets[item.target] = (recipient, resolution)
        if recipient.id == self.sender.id:
            return
        facts = pair_facts(
            sender=self.sender,
            recipient=recipient,
            sha256=item.sha256,
            now=self.now,
            pin_key=resolution.pin_key or "",
        )
        if pin_key_checked(resolution):
            try:
                pin_check(recipient=recipient, target=item.target, pinned_to=facts.pinned_to)
            except SwitchboardError as exc:
                self.targets[item.target] = exc
                return
        if resolution.pin_key:
            self.pinned[resolution.pin_key] = facts.pinned_to
        observed = facts.sender_is_observer or facts.recipient_is_observer
        self.facts[recipient.id] = (
            observed,
            facts.policy,
            facts.policy_by_operator,
            facts.loop_replies,
            facts.unread,
            facts.unread_own,
            facts.loop_sends,
        )
        if item.dedupes and facts.duplicate_of is not None:
            original = Message.objects.get(pk=facts.duplicate_of)
            self.recent[(item.sha256, recipient.id)] = (
                original,
                original.deliveries.get(recipient=recipient),
            )

    def recent_texts_kept(self, found: list[tuple[str, Any, int]]) -> None:
        """Keep the sender's texts within the dedupe window: (text SHA-256, recipient id, delivery
        id), oldest first, as `recent_texts_read` found them."""
        newest = {(sha256, recipient_id): pk for sha256, recipient_id, pk in found}  # oldest first
        if newest:  # usually none: read the rows only for the texts that are sent again
            rows = Delivery.objects.select_related("message").in_bulk(list(newest.values()))
            for key, pk in newest.items():
                self.recent[key] = (rows[pk].message, rows[pk])

    def _target(self, target: str) -> tuple[AgentSession, Resolution] | SwitchboardError:
        """`resolve_recipient` once per distinct address (its NotFound means: try the other hubs)."""
        found = self.targets.get(target)
        if found is None:
            if self.pins:
                self._write()  # resolution reads the sender's pins: write the batch's first
            try:
                recipient, resolution, pinned = resolve_recipient_pinned(
                    self.sender, target, prefixes=self.prefixes
                )
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

    def _inbox(self, recipient: AgentSession) -> _Inbox:
        inbox = self.inboxes.get(recipient.id)
        if inbox is None:
            inbox = self.inboxes[recipient.id] = _Inbox(recipient=recipient)
            facts = self.facts.get(recipient.id) if self.writes.facts_current else None
            if facts is not None:
                self._facts_kept(inbox, facts, read_ahead=True)
            else:
                self._write_for(inbox)  # another sender's batch of the group may have written to it
                self._read_recipient(inbox)
        return inbox

    def _read_recipient(self, inbox: _Inbox) -> None:
        """Read in one query what the batch needs of a recipient that no item changes
        (`pair_facts_read`)."""
        (facts,) = pair_facts_read([(self.sender.id, inbox.recipient.id)], now=self.now).values()
        self._facts_kept(inbox, facts, read_ahead=False)

    def _facts_kept(self, inbox: _Inbox, facts: PairRead, *, read_ahead: bool) -> None:
        """Keep a pair's facts (`PairRead`); when they were read ahead of the send's writes, with
        what it accepted since: its messages queued for the recipient (the sender's among them), its
        texts each way."""
        observed, action, by_operator, replies_read, unread, own, sends = facts
        replies = replies_read
        if read_ahead:
            replies += self.writes.texts_between[(inbox.recipient.id, self.sender.id)]
            unread += self.writes.queued_for[inbox.recipient.id]
            own += self.writes.queued_between[(self.sender.id, inbox.recipient.id)]
        threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
        inbox.observed = observed
        inbox.override = (action, bool(by_operator)) if action is not None else (None, False)
        inbox.looping_back = threshold > 0 and replies >= threshold
        inbox.unread, inbox.unread_own = unread, own
        # `pair_facts` counts the sender's texts only once the replies it read reach the threshold.
        if inbox.looping_back and sends is not None and replies_read >= threshold:
            inbox.sent_there = sends + (
                self.writes.texts_between[(self.sender.id, inbox.recipient.id)] if read_ahead else 0
            )

    def _reserve(self, items: list[_Item]) -> TokenReservation:
        """Rate-limit tokens for every item left that spends them (an agent's, to a local
        recipient), in one store call: at most one each."""
        recipients = []
        for item in items:
            answered = bool(item.key and item.key in self.keyed)
            if item.error is None and not item.request.origin.hub_made and not answered:
                found = self._target(item.target)
                if not isinstance(found, SwitchboardError):
                    recipients.append(found[0].id)
        return limits_reserve(sender=self.sender, recipient_ids=recipients)

    # --- one item ----------------------------------------------------------------------------

    def _send_one(self, item: _Item) -> SendOutcome:
        """Steps 2 to 5 for one item (see the module docstring)."""
        if item.key and item.key in self.keyed:
            return self._earlier(item)
        request = item.request
        origin, forwarded = request.origin, request.origin.forwarded
        recipient, resolution, route = self._recipient(item)
        if recipient.id == self.sender.id:
            raise Invalid("self_target", "A session cannot message itself.")
        reply_checked(self.sender, request.in_reply_to)
        inbox = self._inbox(recipient)
        trust = origin.trust
        if inbox.observed or request.kind == MessageKind.OBSERVER_REPORT:
            # Observers send only observer reports to their target and receive nothing (raises Forbidden).
            trust = (
                PLUGINS.send_guard.check(sender=self.sender, recipient=recipient, kind=request.kind) or trust
            )
        original = self.recent.get((item.sha256, recipient.id)) if self.dedupe and item.dedupes else None
        if original is not None:
            return SendOutcome(message=original[0], delivery=original[1], recipient=recipient, duplicate=True)
        if not origin.hub_made:
            assert self.tokens is not None
            self.tokens.spend(recipient)
            self._check_unread(inbox)
        classification = classify(
            item.text,
            summary=item.summary,
            files=origin.attached
            if forwarded is not None
            else files_scanned(request.files, sender=self.sender),
            kind=request.kind,
            signature_failed=origin.signature_failed,
        )
        if route is not None:
            decision = route.decide(sender=self.sender, text=item.text, kind=request.kind, now=self.now)
            if classification.matches:  # the summary and files count too, wherever the message goes
                decision.tier, decision.sensitivity = classification.tier, classification
        else:
            decision = self._decide(item, inbox, classification, trust)
            if decision.hold_reason == STOPPED_HOLD:
                self._write()  # the caps count every message held for a stopped session
                stopped_holds_checked(recipient, whose=told_of_moves_is(self.sender.id))
        if forwarded is not None:
            decision = forwarded.adjust(decision, recipient=recipient, now=self.now)
        if decision.state == S.HELD and decision.hold_reason != STOPPED_HOLD:
            self._make_room(inbox, decision.hold_reason)
        message = accepted_message(
            message_id=forwarded.message_id if forwarded is not None else None,
            sender=self.sender,
            recipient=recipient,
            kind=request.kind,
            frame_type=request.frame_type,
            text=item.text,
            summary=item.summary,
            size=item.size,
            sha256=item.sha256,
            priority=item.priority,
            decision=decision,
            target=item.target,
            idempotency_key=item.key,
            fingerprint=item.fingerprint,
            in_reply_to=request.in_reply_to,
            now=self.now,
        )
        tier = route.tier if route else (forwarded.tier if forwarded is not None else DeliveryTier.HOST)
        delivery = first_delivery(
            message=message, recipient=recipient, decision=decision, tier=tier, now=self.now
        )
        if request.files:
            # Checked and kept before the message is written (the rows name it by id): a file
            # unknown, too many or too large for the tier fails this message alone.
            self.writes.transaction()
            PLUGINS.attachments.attach(
                message_id=message.id, sender_id=self.sender.id, files=request.files, tier=tier
            )
        outcome = SendOutcome(message=message, delivery=delivery, recipient=recipient)
        self.writes.accepted(
            _Accepted(
                outcome=outcome, resolution=resolution, decision=decision, actor=self.actor, route=route
            )
        )
        self._remember(item, outcome)
        if resolution.rule == "name_ref" or (resolution.pin_key and resolution.rule != "lead"):
            self._pin(resolution.pin_key, recipient)
        if inbox.sent_there is not None and request.kind == MessageKind.TEXT:
            inbox.sent_there += 1
        if decision.state == S.QUEUED and inbox.unread is not None:
            inbox.unread += 1
            if inbox.unread_own is not None and told_of_moves(message) is not None:
                inbox.unread_own += 1  # as the share's triggers count it: not a notice about the sender
        if decision.state == S.HELD and decision.hold_reason != STOPPED_HOLD and inbox.holds is not None:
            inbox.holds += 1
            assert inbox.own_holds is not None  # counted with `holds` (`_make_room`)
            inbox.own_holds += 1
        return outcome

    def _recipient(self, item: _Item) -> tuple[AgentSession, Resolution, RemoteSend | None]:
        """Whom the item's address means (step 2): a session of this hub, live or stopped (a name
        a local session holds is never routed away), else an agent another hub hosts, unless the
        message was forwarded here. Raises what resolution raises."""
        found = self._target(item.target)
        if isinstance(found, NotFound) and item.request.origin.forwarded is None:
            route = PLUGINS.other_hubs.route(sender=self.sender, target=item.target)
            if route is not None:
                return route.recipient, route.resolution, route
        if isinstance(found, SwitchboardError):
            raise found
        return found[0], found[1], None

    def _earlier(self, item: _Item) -> SendOutcome:
        """The answer for a key already used: the original send, or a conflict."""
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

    def _remember(self, item: _Item, outcome: SendOutcome) -> None:
        """What later items must see of a message this batch sent: its key and its text."""
        if item.key:
            self.keyed[item.key] = (item.fingerprint, outcome, outcome.message)
        if item.request.kind == MessageKind.TEXT:
            self.recent[(item.sha256, outcome.recipient.id)] = (outcome.message, outcome.delivery)

    def _check_unread(self, inbox: _Inbox) -> None:
        """The recipient's unread cap, then the sender's share of it: read with the recipient,
        then counted along (both read again after something else wrote to its inbox)."""
        if inbox.unread is None or inbox.unread_own is None:
            self._write_for(inbox)
            inbox.unread, inbox.unread_own = unread_counted(
                recipient_id=inbox.recipient.id, sender_id=self.sender.id
            )
        if inbox.unread >= settings.SWITCHBOARD_UNREAD_PER_RECIPIENT:
            raise queue_full(inbox.recipient)
        if inbox.unread_own >= settings.SWITCHBOARD_UNREAD_PER_SENDER:
            raise unread_share_full(inbox.recipient, inbox.unread_own)

    def _decide(self, item: _Item, inbox: _Inbox, classification: Classification, trust: str) -> Decision:
        """`decide` for a recipient of this hub, with its reads done once per recipient."""
        recipient, kind = inbox.recipient, item.request.kind
        assert inbox.override is not None  # read with the recipient (`_facts_kept`)
        override, by_operator = inbox.override
        verdict_key = (classification.tier == Tier.SENSITIVE, trust)
        facts = decision_facts(
            sender=self.sender,
            recipient=recipient,
            classification=classification,
            trust=trust,
            kind=kind,
            override=override,
            by_operator=by_operator,
            looping=kind == MessageKind.TEXT and self._looping(inbox),
            now=self.now,
            verdict=inbox.verdicts.get(verdict_key),
        )
        inbox.verdicts[verdict_key] = facts.verdict
        return decide(facts)

    def _looping(self, inbox: _Inbox) -> bool:
        """The reply-loop rule: both directions of the pair at or above the loop threshold within
        the window. Each direction is counted once per batch: the reply direction cannot change within it, and the sender's own direction grows
        by what the batch sends."""
        threshold = settings.SWITCHBOARD_LOOP_EXCHANGES
        if threshold <= 0:
            return False
        if not inbox.looping_back:  # read with the recipient (`_facts_kept`)
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

    def _make_room(self, inbox: _Inbox, hold_reason: str) -> None:
        """`holds_make_room` only when the recipient's holds that a hold for `hold_reason` shares
        the cap with are at the cap (all of them and the sender's, counted once, in one query);
        raises HoldFull, expiring nothing, when the sender has no hold of its own to give up."""
        self.writes.transaction()  # the holds it expires and the hold it makes room for go together
        if inbox.holds is None or inbox.own_holds is None:
            self._write_for(inbox)
            inbox.holds, inbox.own_holds = holds_counted(
                recipient_id=inbox.recipient.id, sender_id=self.sender.id, hold_reason=hold_reason
            )
        over = holds_over(inbox.recipient, held=inbox.holds, own=inbox.own_holds)
        if not over:
            return
        self._write()  # the oldest holds may be this batch's own
        moved = holds_make_room(
            recipient=inbox.recipient, sender=self.sender, hold_reason=hold_reason, over=over
        )
        # Only the sender's own holds are expired (so only the sender is notified, below).
        inbox.holds -= len(moved)
        inbox.own_holds -= len(moved)
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

    def _tokens_released(self) -> None:
        """Give back the rate-limit tokens taken and not spent."""
        if self.tokens is not None:
            self.tokens.release()
            self.tokens = None

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
