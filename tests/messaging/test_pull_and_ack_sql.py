"""The pull and the ack read with SQL written once (not compiled by the ORM on every call): they
read exactly what the ORM reads, and on PostgreSQL an ack waits for a pull that holds its rows."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from messaging.models import Delivery, Priority
from messaging.principals import session_principal
from messaging.services.delivery import inbox_ack, inbox_pull
from messaging.services.events import Announcement
from messaging.services.notifications import Notice, notifications_send
from messaging.services.sending import message_send
from messaging.services.sessions import session_register
from messaging.states import DeliveryState as S

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
    plain = message_send(sender=alice, to="bob", text="plain")
    urgent = message_send(sender=alice, to="bob", text="urgent", priority="urgent")
    with_file = message_send(sender=alice, to="bob", text="with a file")
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
    first = message_send(sender=alice, to="bob", text="one").message.id
    second = message_send(sender=alice, to="bob", text="two").message.id
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
    sent = message_send(sender=alice, to="bob", text="hello").message.id
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
    message_send(sender=sender, to=recipient_name, text="plain")
    message_send(sender=sender, to=recipient_name, text="urgent", priority="urgent")
    with_file = message_send(sender=sender, to=recipient_name, text="with a file")
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
    ids = [str(message_send(sender=sender, to=recipient_name, text=f"m{i}").message.id) for i in range(3)]
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
