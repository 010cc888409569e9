"""The pull and the ack read with SQL written once (not compiled by the ORM on every call): they
read exactly what the ORM reads, and on PostgreSQL an ack waits for a pull that holds its rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from messaging.models import Delivery, Message, Priority
from messaging.principals import session_principal
from messaging.services.delivery import (
    _acked_in_one_statement,
    _pulled_in_one_statement,
    inbox_ack,
    inbox_pull,
)
from messaging.services.events import Announcement
from messaging.services.notifications import Notice, notifications_send
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register
from messaging.states import DeliveryState as S
from tests.messaging.plans import plan_nodes, rows_read, the_one_statement

T = TypeVar("T")

CHANGED_BY_THE_PULL = {"state", "updated_at", "delivered_at"}


def _same_fields(got: object, want: object, skip: set[str] = frozenset()) -> None:
    assert type(got) is type(want)
    for field in type(want)._meta.concrete_fields:
        if field.name in skip:
            continue
        mine, theirs = getattr(got, field.attname), getattr(want, field.attname)
        assert (mine, type(mine)) == (theirs, type(theirs)), field.attname


@pytest.mark.django_db
def test_a_pull_reads_what_the_orm_reads() -> None:
    from federation.models import Attachment, MessageAttachment

    alice, bob = session_register(name="alice").session, session_register(name="bob").session
    plain = message_send(SendRequest(sender=alice, to="bob", text="plain"))
    urgent = message_send(SendRequest(sender=alice, to="bob", text="urgent", priority="urgent"))
    with_file = message_send(SendRequest(sender=alice, to="bob", text="with a file"))
    file = Attachment.objects.create(sha256="a" * 64, size=1)
    MessageAttachment.objects.create(
        message_id=with_file.message.id, attachment=file, position=0, name="f.txt"
    )
    with transaction.atomic():
        notifications_send([Notice(recipient_id=bob.id, text="from the hub")])
    expected = list(
        Delivery.objects.filter(recipient=bob, state=S.QUEUED)
        .select_related("message", "message__sender")
        .order_by("-priority", "id")
    )
    assert expected[0].message.priority == Priority.URGENT and len(expected) == 4

    pulled = inbox_pull(recipient=bob, actor=session_principal(bob))

    assert [d.pk for d in pulled] == [d.pk for d in expected]
    for got, want in zip(pulled, expected, strict=True):
        _same_fields(got, want, skip=CHANGED_BY_THE_PULL)
        _same_fields(got.message, want.message)
        if want.message.sender is None:  # the hub's notification
            assert got.message.sender is None
        else:
            _same_fields(got.message.sender, want.message.sender)
        assert got.state == S.DELIVERED and got.delivered_at is not None
    assert {d.message_id: d.carries_files for d in pulled} == {
        plain.message.id: False,
        urgent.message.id: False,
        with_file.message.id: True,
        expected[-1].message_id: False,
    }
    assert set(Delivery.objects.filter(recipient=bob).values_list("state", flat=True)) == {S.DELIVERED}


@pytest.mark.django_db
def test_an_ack_names_each_id_as_it_was_given() -> None:
    alice, bob = session_register(name="alice").session, session_register(name="bob").session
    first = message_send(SendRequest(sender=alice, to="bob", text="one")).message.id
    second = message_send(SendRequest(sender=alice, to="bob", text="two")).message.id
    inbox_pull(recipient=bob, actor=session_principal(bob), limit=1)  # `first` delivered, `second` queued
    inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=[str(first)])

    result = inbox_ack(
        recipient=bob,
        actor=session_principal(bob),
        message_ids=[str(first), str(second), "not-a-uuid", "6f1e8a36-0000-4000-8000-000000000000"],
    )

    assert result == {
        "acked": [str(second)],  # queued may be read straight away
        "already_read": [str(first)],
        "not_acked": [],
        "unknown": sorted(["not-a-uuid", "6f1e8a36-0000-4000-8000-000000000000"]),
    }


@pytest.mark.django_db(transaction=True)
def test_an_ack_waits_for_the_pull_that_holds_its_delivery_then_acks_it() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writer at a time")
    alice, bob = session_register(name="alice").session, session_register(name="bob").session
    sent = message_send(SendRequest(sender=alice, to="bob", text="hello")).message.id
    pulled, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def slow_pull() -> None:
        try:
            with transaction.atomic():
                results["pulled"] = [
                    d.message_id for d in inbox_pull(recipient=bob, actor=session_principal(bob))
                ]
                pulled.set()
                release.wait(10)  # the rows stay locked until this transaction ends
        finally:
            connections.close_all()

    def ack() -> None:
        try:
            results["ack"] = inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=[str(sent)])
        finally:
            connections.close_all()

    puller = threading.Thread(target=slow_pull)
    puller.start()
    assert pulled.wait(10)
    acker = threading.Thread(target=ack)
    acker.start()
    time.sleep(0.3)
    assert "ack" not in results  # waiting on the pull's lock
    release.set()
    puller.join(10)
    acker.join(10)

    assert results["pulled"] == [sent]
    assert results["ack"]["acked"] == [str(sent)]  # saw "delivered" once the pull committed
    assert Delivery.objects.get(message_id=sent).state == S.READ


@pytest.fixture
def receipts(monkeypatch) -> list[Announcement]:
    """PostgreSQL only (the one-statement moves are its): the receipts the moves announce."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement pull and ack are PostgreSQL's")
    import messaging.services.delivery as delivery

    announced: list[Announcement] = []
    monkeypatch.setattr(delivery, "announce_many", lambda items: announced.extend(items))
    return announced


def _pull_setup(sender_name: str, recipient_name: str) -> tuple[object, object]:
    """A recipient with three queued messages (one urgent, one carrying a file) and one held."""
    from federation.models import Attachment, MessageAttachment

    sender = session_register(name=sender_name).session
    recipient = session_register(name=recipient_name).session
    message_send(SendRequest(sender=sender, to=recipient_name, text="plain"))
    message_send(SendRequest(sender=sender, to=recipient_name, text="urgent", priority="urgent"))
    with_file = message_send(SendRequest(sender=sender, to=recipient_name, text="with a file"))
    file, _ = Attachment.objects.get_or_create(sha256="b" * 64, defaults={"size": 1})
    MessageAttachment.objects.create(message_id=with_file.message.id, attachment=file, position=0, name="f")
    Delivery.objects.filter(recipient=recipient, message__text="plain").update(priority=Priority.NORMAL)
    return sender, recipient


def _pulled_shape(
    pulled: list[Delivery], receipts: list[Announcement], sender: object, recipient: object
) -> dict[str, object]:
    from messaging.models import AuditEvent

    ids = [d.pk for d in pulled]
    audit = AuditEvent.objects.filter(kind="delivery.delivered", delivery_id__in=ids).order_by("id")
    stored = {d.pk: d for d in Delivery.objects.filter(pk__in=ids)}
    return {
        "texts": [d.message.text for d in pulled],
        "files": [d.carries_files for d in pulled],
        "from the sender": [d.message.sender.pk == sender.pk for d in pulled],
        "states": [(d.state, stored[d.pk].state) for d in pulled],
        "times": [d.delivered_at == d.updated_at == stored[d.pk].delivered_at is not None for d in pulled],
        "to the recipient": [d.recipient.pk == d.recipient_id == recipient.pk for d in pulled],
        "audit": [
            (a.delivery_id == d.pk, a.message_id == d.message_id, a.target == str(d.recipient_id), a.detail)
            for a, d in zip(audit, pulled, strict=True)
        ],
        "by the recipient": [a.actor == session_principal(recipient).actor for a in audit],
        "receipts": [(r.kind, r.data["state"], r.data["from"], r.sessions == [sender.id]) for r in receipts],
        "receipts in order": [r.data["delivery_id"] for r in receipts] == ids,
    }


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_a_postgres_pull_is_one_statement_with_the_same_outcome(receipts: list) -> None:
    alice, bob = _pull_setup("alice", "bob")
    dave, carol = _pull_setup("dave", "carol")

    with transaction.atomic():  # the statement-by-statement pull
        in_transaction = inbox_pull(recipient=bob, actor=session_principal(bob))
    shape_in_transaction = _pulled_shape(in_transaction, receipts, alice, bob)
    receipts.clear()
    with CaptureQueriesContext(connection) as queries:
        alone = inbox_pull(recipient=carol, actor=session_principal(carol))

    assert len(queries) == 1
    shape_alone = _pulled_shape(alone, receipts, dave, carol)
    assert shape_alone == shape_in_transaction
    assert shape_alone["texts"] == ["urgent", "plain", "with a file"]
    assert shape_alone["files"] == [False, False, True]
    assert all(all(v) for k, v in shape_alone.items() if k.startswith(("from", "to", "by", "times")))
    assert shape_alone["receipts in order"] is True
    assert shape_alone["receipts"] == [("delivery.changed", "delivered", "queued", True)] * 3
    assert [a[3] for a in shape_alone["audit"]] == [{"from": "queued"}] * 3
    assert inbox_pull(recipient=carol, actor=session_principal(carol)) == []


def _ack_setup(sender_name: str, recipient_name: str) -> tuple[object, object, list[str]]:
    """Four messages to the recipient: one still queued, one delivered, one read, one delivered
    but then acked twice over: ids in that order, and an id nobody sent."""
    import uuid

    sender = session_register(name=sender_name).session
    recipient = session_register(name=recipient_name).session
    ids = [
        str(message_send(SendRequest(sender=sender, to=recipient_name, text=f"m{i}")).message.id)
        for i in range(3)
    ]
    states = [S.QUEUED, S.DELIVERED, S.READ]
    for message_id, state in zip(ids, states, strict=True):
        Delivery.objects.filter(message_id=message_id).update(state=state)
    return sender, recipient, [*ids, str(uuid.uuid4())]


def _acked_shape(
    answer: dict, ids: list[str], receipts: list[Announcement], sender: object, recipient: object
) -> dict:
    from messaging.models import AuditEvent

    names = dict(zip(ids, ["queued", "delivered", "read", "unknown"], strict=True))
    deliveries = {str(d.message_id): d for d in Delivery.objects.filter(message_id__in=ids[:3])}
    audit = AuditEvent.objects.filter(kind="delivery.read", message_id__in=ids[:3]).order_by("id")
    return {
        "answer": {k: sorted(names[i] for i in v) for k, v in answer.items()},  # ids sort at random
        "states": {names[i]: d.state for i, d in deliveries.items()},
        "read at": {names[i]: d.read_at is not None for i, d in deliveries.items()},
        "audit": [
            (names[str(a.message_id)], a.delivery_id == deliveries[str(a.message_id)].pk, a.detail, a.target)
            for a in audit
        ],
        "actors": {a.actor == session_principal(recipient).actor for a in audit},
        "targets": {a.target == str(recipient.id) for a in audit},
        "receipts": [
            (r.kind, r.data["state"], r.data["from"], names[r.data["message_id"]], r.sessions == [sender.id])
            for r in receipts
        ],
    }


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_a_postgres_ack_is_one_statement_with_the_same_outcome(receipts: list) -> None:
    alice, bob, bob_ids = _ack_setup("alice", "bob")
    dave, carol, carol_ids = _ack_setup("dave", "carol")

    with transaction.atomic():  # the statement-by-statement ack
        answer = inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=bob_ids)
    in_transaction = _acked_shape(answer, bob_ids, receipts, alice, bob)
    receipts.clear()
    with CaptureQueriesContext(connection) as queries:
        answer = inbox_ack(recipient=carol, actor=session_principal(carol), message_ids=carol_ids)
    alone = _acked_shape(answer, carol_ids, receipts, dave, carol)

    assert len(queries) == 1
    assert alone == {**in_transaction, "audit": [(*a[:3], str(carol.id)) for a in in_transaction["audit"]]}
    assert alone["answer"] == {
        "acked": ["delivered", "queued"],
        "already_read": ["read"],
        "not_acked": [],
        "unknown": ["unknown"],
    }
    assert alone["states"] == {"queued": S.READ, "delivered": S.READ, "read": S.READ}
    assert [a[2] for a in alone["audit"]] == [{"from": "queued"}, {"from": "delivered"}]
    assert alone["actors"] == alone["targets"] == {True}
    assert [r[1:] for r in alone["receipts"]] == [
        ("read", "queued", "queued", True),
        ("read", "delivered", "delivered", True),
    ]


@pytest.mark.django_db
def test_an_ack_moves_the_acker_s_delivery_only() -> None:
    """A message with deliveries to several recipients: the ack finds the message's deliveries and
    moves the acker's, never another recipient's."""
    alice, bob = session_register(name="alice").session, session_register(name="bob").session
    carol = session_register(name="carol").session
    sent = message_send(SendRequest(sender=alice, to="bob", text="to both")).message
    Delivery.objects.create(message=sent, recipient=carol, state=S.DELIVERED)

    result = inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=[str(sent.id)])

    assert result["acked"] == [str(sent.id)]
    assert dict(Delivery.objects.filter(message=sent).values_list("recipient_id", "state")) == {
        bob.id: S.READ,
        carol.id: S.DELIVERED,
    }


def _scans_reading_more_than(limit: int, nodes: list[dict], tables: set[str]) -> list[str]:
    """The scans of `tables` in a plan that read more than `limit` rows in all (`rows_read`), each
    as "node on table (index): rows"."""
    found = []
    for node in nodes:
        if node.get("Relation Name") in tables:
            read = rows_read(node)
            if read > limit:
                where = f"{node['Relation Name']} ({node.get('Index Name', 'no index')})"
                found.append(f"{node['Node Type']} on {where}: {read}")
    return found


def _outside(subplan: str, nodes: list[dict]) -> list[dict]:
    """The nodes of a plan that are not part of `subplan` (a CTE's plan: "CTE picked")."""
    inside: set[int] = set()
    pending = [node for node in nodes if node.get("Subplan Name") == subplan]
    while pending:
        node = pending.pop()
        inside.add(id(node))
        pending.extend(node.get("Plans", []))
    return [node for node in nodes if id(node) not in inside]


def _as_run_later(call: Callable[[], T]) -> tuple[T, tuple[str, list]]:
    """`call()`'s result and the one statement it ran, with everything it wrote undone, so the
    statement can be run again (under EXPLAIN ANALYZE) on the rows as they were."""
    with transaction.atomic():
        ran = the_one_statement(call)
        transaction.set_rollback(True)
    return ran


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("history", ["busy_new_sender", "sender_after_empty_statistics"])
def test_a_pull_and_an_ack_read_rows_by_key_under_misleading_statistics(
    request: pytest.FixtureRequest, history: str, mode: str
) -> None:
    """The one-statement pull and ack (PostgreSQL) read as many rows as they move, whatever the
    statistics say: with bob taken for a rare recipient (analyzed before he got 300 messages), or
    the tables taken for empty. Under the latter, a join of the pulled rows read every delivery
    and every message; under the former, the ack read bob's whole inbox to find ten ids. (Under
    the latter, the pull's pick of bob's queued rows may go through any index: each looks free,
    and which one is taken depends on what earlier tests left in the tables. The hub's own
    statistics job replaces such statistics within seconds.)

    Sequential scans are priced out, as they are on a table of any size: their price follows the
    table's actual pages, so no statistics make them look cheap there, while a read of a whole
    index did look cheap to statistics that take its table for empty. On the few pages these
    tests write, reading the table through is a fair plan."""
    _alice, bob = request.getfixturevalue(history)
    actor, tables = session_principal(bob), {Delivery._meta.db_table, Message._meta.db_table}
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # until the test's transaction ends

    handed, (pull_sql, pull_params) = _as_run_later(lambda: _pulled_in_one_statement(bob, actor, 10))
    pull_plan = plan_nodes(pull_sql, pull_params, mode=mode)
    delivered = Delivery.objects.filter(recipient=bob, state=S.DELIVERED)
    assert sorted(delivered.values_list("id", flat=True)) == sorted(d.pk for d in handed)
    if history == "sender_after_empty_statistics":
        pull_plan = _outside("CTE picked", pull_plan)
    assert _scans_reading_more_than(10, pull_plan, tables) == []

    ids = [str(d.message_id) for d in handed]
    _, (ack_sql, ack_params) = _as_run_later(lambda: _acked_in_one_statement(bob, ids, actor))
    ack_plan = plan_nodes(ack_sql, ack_params, mode=mode)
    assert not delivered.exists() and Delivery.objects.filter(recipient=bob, state=S.READ).count() == 10
    assert _scans_reading_more_than(10, ack_plan, tables) == []
