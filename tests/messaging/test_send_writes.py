"""What a send writes: its message, its delivery and two audit events, with the delivery's id in
the second. On PostgreSQL the three go in one statement, which outside a transaction commits on
its own (no BEGIN and COMMIT); inside one, or when a send writes more, the send takes a savepoint."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from messaging.models import AuditEvent, Delivery, Message
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register

pytestmark = pytest.mark.django_db(transaction=True)  # so a send can run outside any transaction


def _written(message_id: object) -> tuple[Message, Delivery, list[tuple[str, int | None, int | None, str]]]:
    message = Message.objects.get(pk=message_id)
    delivery = Delivery.objects.get(message=message)
    events = list(
        AuditEvent.objects.filter(message_id=message_id)
        .order_by("id")
        .values_list("kind", "delivery_id", "length", "sha256")
    )
    return message, delivery, events


def _check(message_id: object) -> None:
    message, delivery, events = _written(message_id)
    assert events == [
        ("message.accepted", None, message.size, message.sha256),
        ("delivery.queued", delivery.pk, message.size, message.sha256),
    ]


def test_a_send_outside_a_transaction_writes_everything_with_one_statement() -> None:
    alice, bob = session_register(name="alice").session, session_register(name="bob").session

    with CaptureQueriesContext(connection) as queries:  # by ref: no pin to write
        outcome = message_send(SendRequest(sender=alice, to=bob.ref, text="one statement"))

    writes = [q["sql"] for q in queries.captured_queries if "INSERT INTO" in q["sql"].upper()]
    assert len(writes) == (1 if connection.vendor == "postgresql" else 3)
    assert outcome.delivery.pk == Delivery.objects.get(message_id=outcome.message.id).pk
    _check(outcome.message.id)


def test_a_send_inside_a_transaction_writes_the_same_and_rolls_back_with_it() -> None:
    alice, _bob = session_register(name="alice").session, session_register(name="bob").session

    with transaction.atomic():
        kept = message_send(SendRequest(sender=alice, to="bob", text="kept"))
    _check(kept.message.id)

    with pytest.raises(RuntimeError), transaction.atomic():
        gone = message_send(SendRequest(sender=alice, to="bob", text="rolled back"))
        raise RuntimeError("the caller's transaction fails after the send")
    assert not Message.objects.filter(pk=gone.message.id).exists()
    assert not AuditEvent.objects.filter(message_id=gone.message.id).exists()


def test_a_repeated_idempotency_key_outside_a_transaction_answers_with_the_original() -> None:
    alice, bob = session_register(name="alice").session, session_register(name="bob").session
    first = message_send(SendRequest(sender=alice, to=bob.ref, text="once", idempotency_key="k1"))
    again = message_send(SendRequest(sender=alice, to=bob.ref, text="once", idempotency_key="k1"))
    assert again.message.id == first.message.id
    assert Message.objects.filter(sender=alice).count() == 1
    _check(first.message.id)
