"""The pull and the ack read with SQL written once (not compiled by the ORM on every call): they
read exactly what the ORM reads, and on PostgreSQL an ack waits for a pull that holds its rows."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from messaging.models import Delivery, Priority
from messaging.principals import session_principal
from messaging.services.delivery import inbox_ack, inbox_pull
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
