"""Moving deliveries between states: inbox pull and ack, releases and expiry.

Every move is a conditional update on the current state (`delivery_transition`), so a retried
task or a duplicate request can never move a delivery twice, and each move is audited once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, F, Model, Q, QuerySet, When
from django.utils import timezone

from messaging.errors import Invalid
from messaging.hold_reasons import STOPPED_HOLD
from messaging.models import AgentSession, AuditEvent, Delivery, Message, MessageKind, SessionStatus
from messaging.plugins import PLUGINS
from messaging.principals import HUB, Principal
from messaging.services.audit import audit_events_write, audit_rows
from messaging.services.bulk import as_uuid, joined_models_selected, json_text, select_columns
from messaging.services.events import Announcement, announce_many
from messaging.states import STATE_TIMESTAMP, DeliveryState, can_transition, sources_of
from messaging.uds import UDS_PREFIX

S = DeliveryState


@dataclass(frozen=True)
class Moved:
    delivery_id: int
    message_id: Any
    recipient_id: Any
    sender_id: Any  # the session told of the move (`told_of_moves`), None for nobody
    from_state: str
    to_state: str


# Who hears of a message's way (its `message.sent` event, receipts, the hub's word on its holds,
# its status at GET /messages/{id}): its sender, except for a notification. A notification with
# a sender is one the hub wrote about that session (a fired notify-when-idle subscription) to a
# reader the session did not choose, and the session must not learn who watches it or when they
# read. One rule, in the three forms its readers need: a message, an ORM expression, SQL on `m`.
def told_of_moves(message: Message) -> Any:
    """The session told of `message`'s moves: its sender, or None for a notification."""
    return None if message.kind == MessageKind.NOTIFICATION else message.sender_id


_SENDER_TOLD = ~Q(message__kind=MessageKind.NOTIFICATION)  # a delivery's message is not a notice
TOLD_OF_MOVES = Case(When(_SENDER_TOLD, then=F("message__sender_id")))
TOLD_OF_MOVES_SQL = f"CASE WHEN m.kind = '{MessageKind.NOTIFICATION.value}' THEN NULL ELSE m.sender_id END"


def told_of_moves_is(session_id: Any) -> Q:
    """Deliveries whose moves `session_id` is told of: its messages, in the sense every per-sender
    count means them (the unread share, kept by migration 0012's triggers with `TOLD_OF_MOVES_SQL`;
    the stopped-hold shares), so no count answers a session about a notice it never sent."""
    return Q(message__sender_id=session_id) & _SENDER_TOLD


def _lock(qs: QuerySet[Delivery]) -> QuerySet[Delivery]:
    if connection.features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True, of=("self",))
    return qs  # SQLite: BEGIN IMMEDIATE already serializes writers


def delivery_transition(
    deliveries: QuerySet[Delivery],
    *,
    to: str,
    actor: Principal,
    reason: str = "",
    updates: dict[str, Any] | None = None,
    now: datetime | None = None,
    limit: int | None = None,
) -> list[Moved]:
    """Move every delivery in `deliveries` that may legally go to `to`; skip the rest.

    Must run inside a transaction. Returns what moved (each audited as `delivery.<to>`)."""
    qs = _lock(deliveries.filter(state__in=sources_of(to))).order_by("-priority", "id")
    if limit is not None:
        qs = qs[:limit]
    rows = list(
        qs.annotate(told=TOLD_OF_MOVES).values_list("id", "state", "message_id", "recipient_id", "told")
    )
    return _move_locked(rows, to=to, actor=actor, reason=reason, updates=updates, now=now)


def _move_locked(
    rows: list[tuple[Any, ...]],
    *,
    to: str,
    actor: Principal,
    reason: str = "",
    updates: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> list[Moved]:
    """Move rows already locked and known to be in a source state of `to` (id, state, message id,
    recipient id, told session id each: `told_of_moves`): update, audit and announce them."""
    if not rows:
        return []
    now = now or timezone.now()
    moved = [
        Moved(pk, message_id, recipient_id, sender_id, state, to)
        for pk, state, message_id, recipient_id, sender_id in rows
    ]
    by_state: dict[str, list[int]] = {}
    for m in moved:
        by_state.setdefault(m.from_state, []).append(m.delivery_id)
    _update_by_state(by_state, _moved_fields(to, now, updates))
    audit_events_write(
        [
            _move_audit(
                to=to,
                actor=actor,
                reason=reason,
                from_state=m.from_state,
                delivery_id=m.delivery_id,
                message_id=m.message_id,
                target=str(m.recipient_id),
            )
            for m in moved
        ],
        at=now,
    )
    _announce_moves(moved)
    return moved


def _moved_fields(to: str, now: datetime, updates: dict[str, Any] | None = None) -> dict[str, Any]:
    """The columns a move to `to` writes (field name → value): the state, when the row changed,
    `updates`, and the state's own timestamp column (`STATE_TIMESTAMP`). The one list of them,
    which the portable moves and PostgreSQL's one-statement pull and ack each write."""
    fields: dict[str, Any] = {"state": to, "updated_at": now, **(updates or {})}
    if to in STATE_TIMESTAMP:
        fields[STATE_TIMESTAMP[to]] = now
    return fields


def _move_audit(
    *,
    to: str,
    actor: Principal,
    from_state: Any,
    delivery_id: Any,
    message_id: Any,
    target: Any,
    reason: str = "",
) -> dict[str, Any]:
    """A move's audit event, as `audit_events_write` takes it: the one shape of the
    `delivery.<to>` events. PostgreSQL's one-statement pull and ack build theirs with it too,
    with `_Column`s for what each moved row gives (`_insert_each`)."""
    return {
        "kind": f"delivery.{to}",
        "actor": actor.actor,
        "target": target,
        "delivery_id": delivery_id,
        "message_id": message_id,
        "detail": {"from": from_state, **({"reason": reason} if reason else {})},
    }


def _assignments(fields: dict[str, Any], *, prepare: bool = True) -> tuple[str, list[Any]]:
    """An UPDATE's `column = %s, ...` for `fields` (field name → value), and the values, each
    prepared for the database by its field; without `prepare`, as they are (PostgreSQL's fast
    paths: psycopg takes a move's strings and datetimes as they are, as `bulk_insert` does)."""
    if not prepare:
        return _set_clause(tuple(fields)), list(fields.values())
    columns = [(Delivery._meta.get_field(name), value) for name, value in fields.items()]
    return _set_clause(tuple(fields)), [f.get_db_prep_save(value, connection) for f, value in columns]


@functools.cache
def _set_clause(names: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    return ", ".join(f"{qn(Delivery._meta.get_field(name).column)} = %s" for name in names)


def _update_by_state(by_state: dict[str, list[int]], fields: dict[str, Any]) -> None:
    """UPDATE the deliveries of each state to `fields` (what `QuerySet.update` does, without
    compiling a query each time: every pull and ack runs this)."""
    qn = connection.ops.quote_name
    assignments, values = _assignments(fields)
    with connection.cursor() as cursor:
        for state, ids in by_state.items():
            in_ids, id_params = _in_list("id", ids)
            cursor.execute(
                f"UPDATE {qn(Delivery._meta.db_table)} SET {assignments} WHERE {in_ids} AND state = %s",
                [*values, *id_params, state],
            )


@dataclass(frozen=True)
class _Column:
    """In a row given to `_insert_each`: the value of this SQL expression in each row read."""

    sql: str


def _insert_each(model: type[Model], row: dict[str, Any], source: str) -> tuple[str, list[Any]]:
    """PostgreSQL: an `INSERT INTO <model's table> (...) SELECT ... FROM <source>` that writes one
    row per row of `source`, each as `row` (field attname → value, as `bulk_insert` takes them)
    says: a `_Column` is read from the row of `source`, a JSON object holding `_Column`s is built
    for each row, any other value is a parameter. Returns the statement and its parameters, in
    order, so that a statement written as one can still take its rows from a row builder. As in
    `bulk_insert`, the values are what the columns hold, and PostgreSQL reads each as its
    column's type; the statement is written once for each shape of `row`."""
    params: list[Any] = []
    shape: list[tuple[str, Any]] = []
    for name, value in row.items():
        if isinstance(value, _Column):
            shape.append((name, value.sql))
        elif isinstance(value, dict):
            per_row = tuple((k, v.sql) for k, v in value.items() if isinstance(v, _Column))
            shape.append((name, per_row))
            params.append(json_text({k: v for k, v in value.items() if not isinstance(v, _Column)}))
            params += [k for k, _ in per_row]
        else:
            shape.append((name, None))
            params.append(value)
    return _insert_each_statement(model, tuple(shape), source), params


@functools.cache
def _insert_each_statement(model: type[Model], shape: tuple[tuple[str, Any], ...], source: str) -> str:
    """`_insert_each`'s statement for rows of `shape`: per field, in `row`'s order, the SQL of its
    `_Column`, the (key, SQL) pairs of a JSON object's `_Column`s, or None for a parameter."""
    qn = connection.ops.quote_name
    columns, selected = [], []
    for name, how in shape:
        columns.append(qn(model._meta.get_field(name).column))
        if isinstance(how, str):
            selected.append(how)
        elif isinstance(how, tuple):
            pairs = ", ".join(f"%s::text, {sql}" for _, sql in how)
            selected.append(f"(%s::jsonb || jsonb_build_object({pairs}))" if how else "%s::jsonb")
        else:
            selected.append("%s")
    return (
        f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(selected)} FROM {source}"
    )


def _in_list(column: str, values: list[Any]) -> tuple[str, list[Any]]:
    """`column` is one of `values`: one array parameter on PostgreSQL (one prepared statement
    whatever the count), a placeholder each elsewhere."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [list(values)]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


def _announce_moves(moved: list[Moved]) -> None:
    """Receipts: each move goes to the message's sender (and the console). Not to the recipient,
    which made most of them itself (pull, ack) and learns of new messages from `inbox.queued`;
    every event to its group would wake its sockets and long-polls for nothing."""
    announce_many(
        [
            Announcement(
                "delivery.changed",
                {
                    "message_id": str(m.message_id),
                    "delivery_id": m.delivery_id,
                    "state": m.to_state,
                    "from": m.from_state,
                },
                [m.sender_id] if m.sender_id else [],
            )
            for m in moved
        ]
    )


def inbox_pull(
    *, recipient: AgentSession, actor: Principal, limit: int = 100, include_unacked: bool = False
) -> list[Delivery]:
    """Hand the recipient its queued messages (urgent first, then oldest first), marking them
    delivered. With `include_unacked`, messages delivered earlier but never acked come too."""
    if limit < 1 or limit > 1000:
        raise Invalid("bad_limit", "limit is between 1 and 1000.")
    if connection.vendor == "postgresql" and not connection.in_atomic_block and not include_unacked:
        return _pulled_in_one_statement(recipient, actor, limit)
    with transaction.atomic():
        handed = _queued_locked(recipient, limit)
        now = timezone.now()
        _move_locked(
            [(d.pk, d.state, d.message_id, d.recipient_id, told_of_moves(d.message)) for d in handed],
            to=S.DELIVERED,
            actor=actor,
            now=now,
        )
        for delivery in handed:
            delivery.state, delivery.delivered_at, delivery.updated_at = S.DELIVERED, now, now
        if include_unacked and len(handed) < limit:
            earlier = list(
                Delivery.objects.filter(recipient=recipient, state=S.DELIVERED)
                .exclude(pk__in=[d.pk for d in handed])
                .select_related("message", "message__sender")
                .order_by("-priority", "id")[: limit - len(handed)]
            )
            for delivery in earlier:
                delivery.redelivered = True  # handed over by an earlier pull or push, never acked
            handed += earlier
        for delivery in handed:
            delivery.recipient = recipient
        return sorted(handed, key=lambda d: (-d.priority, d.pk))


@functools.cache
def _pull_statement(vendor: str) -> str:
    """A recipient's queued deliveries, each with its message, the message's sender and whether
    it carries files, urgent first then oldest first, locked (PostgreSQL: rows another pull holds
    are skipped). Written once per database, not compiled by the ORM on every pull."""
    delivery = connection.ops.quote_name(Delivery._meta.db_table)
    lock = " FOR UPDATE OF d SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    return (
        f"{_handed_select(f'{delivery} d', 'd')} "
        f"WHERE d.recipient_id = %s AND d.state = %s ORDER BY d.priority DESC, d.id LIMIT %s{lock}"
    )


def _handed_select(source: str, alias: str, *, message_by_key: bool = False) -> str:
    """The SELECT a pull reads its deliveries with (`_handed` takes its rows): from `source`
    (the deliveries, named `alias`), each delivery's columns, its message's, the message's
    sender's, and whether the message carries files. With `message_by_key` (PostgreSQL), each
    message is read by its key for its delivery, whatever the planner's statistics say."""
    qn = connection.ops.quote_name
    message, session = qn(Message._meta.db_table), qn(AgentSession._meta.db_table)
    table = PLUGINS.attachments.table
    carries_files = f"EXISTS (SELECT 1 FROM {qn(table)} a WHERE a.message_id = m.id)" if table else "(1 = 0)"
    if message_by_key:
        joined = f"CROSS JOIN LATERAL (SELECT * FROM {message} WHERE id = {alias}.message_id OFFSET 0) m"
    else:
        joined = f"JOIN {message} m ON m.id = {alias}.message_id"
    return (
        f"SELECT {select_columns(Delivery, alias)}, {select_columns(Message, 'm')}, "
        f"{select_columns(AgentSession, 's')}, "
        f"{carries_files} "
        f"FROM {source} {joined} LEFT JOIN {session} s ON s.id = m.sender_id"
    )


def _handed(rows: list[list[Any]]) -> list[Delivery]:
    """The deliveries of `_handed_select`'s rows, with their messages and senders attached and
    `carries_files` set (which `frames_for_recipient` reads)."""
    handed = []
    for delivery, message, sender, carries_files in rows:
        message._state.fields_cache["sender"] = sender
        delivery._state.fields_cache["message"] = message
        delivery.carries_files = bool(carries_files)
        handed.append(delivery)
    return handed


def _queued_locked(recipient: AgentSession, limit: int) -> list[Delivery]:
    """Read and lock up to `limit` of the recipient's queued deliveries in one query (`_handed`)."""
    recipient_id = AgentSession._meta.pk.get_db_prep_value(recipient.pk, connection)
    return _handed(
        joined_models_selected(
            (Delivery, Message, AgentSession),
            _pull_statement(connection.vendor),
            [recipient_id, S.QUEUED, limit],
        )
    )


def _pulled_in_one_statement(recipient: AgentSession, actor: Principal, limit: int) -> list[Delivery]:
    """PostgreSQL, outside a transaction: `inbox_pull` as one statement (`_pull_write_statement`),
    so a push costs one round trip instead of five (BEGIN, lock and read, update, audit, COMMIT).
    The same rows move, writing the same columns (`_moved_fields`) and audit events
    (`_move_audit`), with the same receipts."""
    now = timezone.now()
    assignments, values = _assignments(_moved_fields(S.DELIVERED, now), prepare=False)
    audit, audit_params = _insert_each(
        AuditEvent,
        audit_rows([_moved_row_audit(S.DELIVERED, actor, "moved", from_state=S.QUEUED)], at=now)[0],
        "moved ORDER BY moved.priority DESC, moved.id",
    )
    recipient_id = AgentSession._meta.pk.get_db_prep_value(recipient.pk, connection)
    handed = _handed(
        joined_models_selected(
            (Delivery, Message, AgentSession),
            _pull_write_statement(assignments, audit),
            [recipient_id, S.QUEUED, limit, *values, *audit_params],
        )
    )
    for delivery in handed:
        delivery.recipient = recipient
    _announce_moves(
        [
            Moved(d.pk, d.message_id, d.recipient_id, told_of_moves(d.message), S.QUEUED, S.DELIVERED)
            for d in handed
        ]
    )
    return handed


def _moved_row_audit(to: str, actor: Principal, alias: str, *, from_state: Any) -> dict[str, Any]:
    """The audit event (`_move_audit`) of each delivery row `alias` of a statement, for `_insert_each`."""
    return _move_audit(
        to=to,
        actor=actor,
        from_state=from_state,
        delivery_id=_Column(f"{alias}.id"),
        message_id=_Column(f"{alias}.message_id"),
        target=_Column(f"{alias}.recipient_id"),  # PostgreSQL writes the UUID as text, as str() does
    )


@functools.cache
def _pull_write_statement(assignments: str, audit: str) -> str:
    """PostgreSQL: lock up to a limit of a recipient's queued deliveries (urgent first, then
    oldest first, skipping rows another pull holds), mark them delivered (`assignments`), write
    their `delivery.delivered` audit events (`audit`, reading the moved rows as `moved`), and read
    them back as `_pull_statement` does (`_handed_select`), all in one statement.

    Every row it reads after the pick is read by its key (the update's by an array of the picked
    ids, each message behind a LATERAL subquery that `OFFSET 0` keeps from being flattened into a
    join), so the cost follows the rows pulled, not the tables' sizes, even under statistics that
    take the tables for empty (analyzed while they held a page and no live row), under which a
    join of the picked rows would read every delivery and every message."""
    delivery = connection.ops.quote_name(Delivery._meta.db_table)
    return (
        f"WITH picked AS (SELECT id FROM {delivery} WHERE recipient_id = %s AND state = %s "
        "ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED), "
        f"moved AS (UPDATE {delivery} AS u SET {assignments} "
        "WHERE u.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING u.*), "
        f"audit AS ({audit}) "
        f"{_handed_select('moved', 'moved', message_by_key=True)} ORDER BY moved.priority DESC, moved.id"
    )


def inbox_ack(
    *, recipient: AgentSession, actor: Principal, message_ids: Iterable[str]
) -> dict[str, list[str]]:
    """Mark the named messages read. Returns which ids were acked, already read, or unknown."""
    wanted = {str(m) for m in message_ids}
    if not wanted:
        raise Invalid("empty_ack", "Name at least one message id to acknowledge.")
    if len(wanted) > 1000:
        raise Invalid("bad_limit", "Acknowledge at most 1000 messages at a time.")
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        rows, moved = _acked_in_one_statement(recipient, _valid_uuids(wanted), actor)
    else:
        with transaction.atomic():
            rows = _acked_locked(recipient, _valid_uuids(wanted))
            sources = sources_of(S.READ)
            moved = _move_locked([row for row in rows if row[1] in sources], to=S.READ, actor=actor)
    states = {str(message_id): state for _pk, state, message_id, *_ in rows}
    acked = sorted(str(m.message_id) for m in moved)
    return {
        "acked": acked,
        "already_read": sorted(mid for mid, st in states.items() if st == S.READ),
        "not_acked": sorted(mid for mid, st in states.items() if st not in (S.READ,) and mid not in acked),
        "unknown": sorted(wanted - set(states)),
    }


def _acked_locked(recipient: AgentSession, message_ids: list[str]) -> list[tuple[Any, ...]]:
    """The recipient's deliveries of `message_ids` (id, state, message id, recipient id, the
    session told: `told_of_moves`), locked in id order. An ack waits for a pull that holds one of
    them (every other move skips locked rows, so nothing waits the other way round) and then sees
    its state."""
    if not message_ids:
        return []
    qn = connection.ops.quote_name
    field = Delivery._meta.get_field("message")
    in_messages, params = _in_list(
        "d.message_id", [field.get_db_prep_value(m, connection) for m in message_ids]
    )
    lock = " FOR UPDATE OF d" if connection.features.has_select_for_update_of else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT d.id, d.state, d.message_id, {TOLD_OF_MOVES_SQL} "
            f"FROM {qn(Delivery._meta.db_table)} d JOIN {qn(Message._meta.db_table)} m ON m.id = d.message_id "
            f"WHERE d.recipient_id = %s AND {in_messages} ORDER BY d.id{lock}",
            [AgentSession._meta.pk.get_db_prep_value(recipient.pk, connection), *params],
        )
        rows = cursor.fetchall()
    return [(pk, state, as_uuid(mid), recipient.id, as_uuid(sid)) for pk, state, mid, sid in rows]


def _acked_in_one_statement(
    recipient: AgentSession, message_ids: list[str], actor: Principal
) -> tuple[list[tuple[Any, ...]], list[Moved]]:
    """PostgreSQL, outside a transaction: what `_acked_locked` and `_move_locked` do for an ack, as
    one statement (`_ack_write_statement`): the rows as `_acked_locked` gives them, and what moved
    to read (with the columns and audit events `_move_locked` writes, announced as it does). Locks
    as `_acked_locked` does: waits for a pull that holds a row, then sees the row as that pull left it."""
    if not message_ids:
        return [], []
    field = Delivery._meta.get_field("message")
    now = timezone.now()
    assignments, values = _assignments(_moved_fields(S.READ, now), prepare=False)
    audit, audit_params = _insert_each(
        AuditEvent,
        audit_rows([_moved_row_audit(S.READ, actor, "locked", from_state=_Column("locked.state"))], at=now)[
            0
        ],
        "locked JOIN moved ON moved.id = locked.id ORDER BY locked.id",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _ack_write_statement(assignments, audit),
            [
                [field.get_db_prep_value(m, connection) for m in message_ids],
                AgentSession._meta.pk.get_db_prep_value(recipient.pk, connection),
                *values,
                list(sources_of(S.READ)),
                *audit_params,
            ],
        )
        found = cursor.fetchall()
    rows, moved = [], []
    for pk, state, message_id, sender_id, was_moved in found:
        row = (pk, state, as_uuid(message_id), recipient.id, as_uuid(sender_id))
        rows.append(row)
        if was_moved:
            moved.append(Moved(pk, row[2], recipient.id, row[4], state, S.READ))
    _announce_moves(moved)
    return rows, moved


@functools.cache
def _ack_write_statement(assignments: str, audit: str) -> str:
    """PostgreSQL: lock the recipient's deliveries of the acked messages in id order, mark those
    in a state that may go to read as read (`assignments`), write their `delivery.read` audit
    events (`audit`, reading each moved row's locked row as `locked`), and answer each locked row
    (id, state before, message id, the session told: `told_of_moves`) with whether it moved.

    Each acked message's deliveries are read by message (`delivery_once_per_recipient`), and the
    recipient's kept; every later read is by key (arrays of ids, the senders behind a LATERAL
    subquery). `OFFSET 0` keeps each subquery from being flattened into a join or given the
    recipient's condition, so the cost follows the ids acked (and their messages' recipients),
    not the recipient's inbox or the tables, under any statistics. The recipient's condition
    inside would let statistics that take the recipient for a rare one (analyzed before it got
    busy) read its whole inbox through `delivery_inbox`; a join of the locked rows, under
    statistics that take the tables for empty, would read every delivery and every message. The price:
    PostgreSQL's plan for an unknown number of ids costs more than its plan for the ids given, so
    it plans this statement on every call instead of reusing one plan: a small fixed cost per ack,
    so that no statistics can make an ack's cost grow with the tables."""
    qn = connection.ops.quote_name
    delivery, message = qn(Delivery._meta.db_table), qn(Message._meta.db_table)
    return (
        "WITH found AS (SELECT f.id FROM "
        f"(SELECT id, recipient_id FROM {delivery} WHERE message_id = ANY(%s) OFFSET 0) f "
        "WHERE f.recipient_id = %s), "
        f"locked AS (SELECT d.id, d.state, d.message_id, d.recipient_id FROM {delivery} d "
        "WHERE d.id = ANY(ARRAY(SELECT id FROM found)) ORDER BY d.id FOR UPDATE), "
        f"moved AS (UPDATE {delivery} AS u SET {assignments} "
        "WHERE u.id = ANY(ARRAY(SELECT id FROM locked WHERE state = ANY(%s))) RETURNING u.id), "
        f"audit AS ({audit}) "
        "SELECT locked.id, locked.state, locked.message_id, m.sender_id, moved.id IS NOT NULL "
        f"FROM locked CROSS JOIN LATERAL (SELECT {TOLD_OF_MOVES_SQL} AS sender_id FROM {message} m "
        "WHERE m.id = locked.message_id OFFSET 0) m "
        "LEFT JOIN moved ON moved.id = locked.id ORDER BY locked.id"
    )


def _valid_uuids(values: Iterable[str]) -> list[str]:
    import uuid

    out = []
    for value in values:
        try:
            out.append(str(uuid.UUID(value)))
        except ValueError:
            continue
    return out


def deliveries_release_for_recipient(*, recipient: AgentSession, actor: Principal) -> list[Moved]:
    """The recipient is back: queue what was held because it was stopped."""
    moved = delivery_transition(
        Delivery.objects.filter(recipient=recipient, state=S.HELD, hold_reason=STOPPED_HOLD),
        to=S.QUEUED,
        actor=actor,
        reason="recipient_started",
        updates={"expires_at": None},
    )
    from messaging.services.transports import schedule_pushes

    schedule_pushes([(m.delivery_id, recipient) for m in moved])
    return moved


def deliveries_retire_for_exit(*, recipient: AgentSession, actor: Principal) -> list[Moved]:
    """The recipient exited for good: what still waits for it expires, and senders are told.

    A delivery whose socket write is under way is left to that write, since the receiver may
    already hold the frame: it ends delivered if the write succeeds, and expires when the write
    fails (`delivery_socket_failed`) or when its lease runs out (`delivery_socket_claim`)."""
    return _expired_for_exit(Delivery.objects.filter(recipient=recipient), actor=actor)


def _expired_for_exit(deliveries: QuerySet[Delivery], *, actor: Principal) -> list[Moved]:
    """Expire those of `deliveries` still waiting (queued or held) that no socket write is under
    way for, telling their senders the recipient exited. Must run inside a transaction."""
    from messaging.services.holds import holds_notify

    moved = delivery_transition(
        deliveries.exclude(writing_until__gt=timezone.now()),
        to=S.EXPIRED,
        actor=actor,
        reason="recipient_exited",
        updates={"decision_reason": "recipient exited"},
    )
    holds_notify(moved, outcome="exited")
    return moved


def deliveries_expire_due(*, now: datetime | None = None, batch: int = 1000) -> list[Moved]:
    """Expire held deliveries whose deadline has passed (by the database's clock). Idempotent."""
    from messaging.services.holds import holds_notify

    now = now or _db_now()
    with transaction.atomic():
        moved = delivery_transition(
            Delivery.objects.filter(state=S.HELD, expires_at__lte=now),
            to=S.EXPIRED,
            actor=HUB,
            reason="hold_expired",
            updates={"decision_reason": "hold expired"},
            now=now,
            limit=batch,
        )
        holds_notify(moved, outcome="expired")
        return moved


def _db_now() -> datetime:
    """The database server's clock, so a worker with a skewed clock never expires a hold early."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
    return timezone.now()


def delivery_mark_delivered(*, delivery_id: int, actor: Principal, via: str) -> bool:
    """A transport handed the message over (socket write, WebSocket push). True when it moved now."""
    with transaction.atomic():
        moved = delivery_transition(
            Delivery.objects.filter(pk=delivery_id, state=S.QUEUED), to=S.DELIVERED, actor=actor, reason=via
        )
    return bool(moved)


def delivery_socket_claim(*, delivery_id: int, lease_seconds: float) -> Delivery | None:
    """Start one socket-write attempt: claim a queued delivery that is due (never tried, or its
    retry time or an earlier attempt's lease has passed), count the attempt and lease it, so two
    workers never write the same delivery at once. None when it is not queued or not due. One
    whose recipient has exited is never written: it expires (its exit left it to a write whose
    worker was lost)."""
    from datetime import timedelta

    from django.db.models import F, Max, Q

    now = timezone.now()
    due = Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True, attempts=0)
    queued = Delivery.objects.filter(pk=delivery_id, state=S.QUEUED)
    recipient = queued.values_list("recipient_id", "recipient__status").first()
    if recipient is None:
        return None
    recipient_id, status = recipient
    if status == SessionStatus.EXITED:
        with transaction.atomic():
            _expired_for_exit(queued, actor=HUB)
        return None
    # While one of the recipient's deliveries waits out a failed write, the rest wait with it (no
    # attempt counted): a socket that stopped reading then costs one timeout per retry instead of one
    # per queued message, and cannot tie up every worker while other sessions' sockets wait.
    failing_until = (
        Delivery.objects.filter(recipient_id=recipient_id, state=S.QUEUED, next_attempt_at__gt=now)
        .exclude(pk=delivery_id)
        .exclude(last_error="")
        .aggregate(until=Max("next_attempt_at"))["until"]
    )
    if failing_until is not None:
        Delivery.objects.filter(due, pk=delivery_id, state=S.QUEUED).update(
            next_attempt_at=failing_until, updated_at=now
        )
        return None
    lease = now + timedelta(seconds=lease_seconds)
    claimed = Delivery.objects.filter(due, pk=delivery_id, state=S.QUEUED).update(
        attempts=F("attempts") + 1, next_attempt_at=lease, writing_until=lease, updated_at=now
    )
    if not claimed:
        return None
    return Delivery.objects.select_related("message", "message__sender", "recipient").get(pk=delivery_id)


def delivery_socket_failed(*, delivery_id: int, error: str, retry_in: float | None) -> None:
    """Record a failed socket attempt and when to try again; `retry_in=None` gives up on the socket
    and leaves the delivery queued, so the recipient still gets it by pull or WebSocket. When the
    recipient has exited (it left the delivery to this write), the delivery expires instead."""
    from datetime import timedelta

    from messaging.services.audit import audit_event

    now = timezone.now()
    retry_at = now + timedelta(seconds=retry_in) if retry_in is not None else None
    with transaction.atomic():
        queued = Delivery.objects.filter(pk=delivery_id, state=S.QUEUED)
        row = queued.values("attempts", "recipient_id").first()
        if row is None:
            return
        # Locked, so an exit under way commits first (and this sees it) or waits for this write's
        # end to be recorded (and then expires the delivery itself): none stays queued for a
        # session that exited.
        status = (
            AgentSession.objects.select_for_update(no_key=True)
            .filter(pk=row["recipient_id"])
            .values_list("status", flat=True)
            .first()
        )
        queued.update(last_error=error[:500], next_attempt_at=retry_at, writing_until=None, updated_at=now)
        audit_event(
            "delivery.attempt_failed",
            actor="hub",
            target=str(row["recipient_id"]),
            delivery_id=delivery_id,
            detail={"via": "uds", "attempts": row["attempts"], "error": error[:200], "gave_up": not retry_at},
        )
        if status == SessionStatus.EXITED:
            _expired_for_exit(queued, actor=HUB)


def deliveries_due_for_socket(*, batch: int = 500) -> list[int]:
    """Queued socket deliveries whose retry time (or a lost worker's lease) has passed, and those
    whose first write never started a lease-length after they were queued: their task was lost
    with the broker (Redis restarted empty, a worker killed with it prefetched). The database is
    the truth, so they are driven again; the claim in `delivery_socket_claim` keeps it to one write."""
    from datetime import timedelta

    from django.conf import settings
    from django.db.models import Q

    now = timezone.now()
    lease = timedelta(seconds=float(settings.SWITCHBOARD_SOCKET_TIMEOUT) * 2 + 5)
    never_started = Q(attempts=0, next_attempt_at__isnull=True, queued_at__lte=now - lease)
    return list(
        Delivery.objects.filter(
            Q(next_attempt_at__lte=now) | never_started,
            state=S.QUEUED,
            recipient__peer_address__startswith=UDS_PREFIX,
        )
        .order_by("next_attempt_at", "id")
        .values_list("id", flat=True)[:batch]
    )


__all__ = [
    "Moved",
    "can_transition",
    "delivery_transition",
    "deliveries_expire_due",
    "deliveries_release_for_recipient",
    "deliveries_retire_for_exit",
    "delivery_mark_delivered",
    "delivery_socket_claim",
    "delivery_socket_failed",
    "deliveries_due_for_socket",
    "inbox_ack",
    "inbox_pull",
]
