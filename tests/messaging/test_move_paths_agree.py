"""PostgreSQL's one-statement pull and ack write what the portable moves write: the same columns
of each delivery (the state, its timestamp column from `STATE_TIMESTAMP`) and the same audit
events, every column of them. A fast path that spells a state, a timestamp or an audit field its
own way fails here."""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from messaging.models import AgentSession, AuditEvent, Delivery
from messaging.principals import session_principal
from messaging.services.delivery import inbox_ack, inbox_pull
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register

TEXTS = ["first", "second", "urgent"]


def _sent(sender_name: str, recipient_name: str) -> tuple[AgentSession, AgentSession]:
    """The sender sends the recipient TEXTS (the last one urgent)."""
    sender = session_register(name=sender_name).session
    recipient = session_register(name=recipient_name).session
    for text in TEXTS:
        message_send(
            SendRequest(
                sender=sender,
                to=recipient_name,
                text=text,
                **({"priority": "urgent"} if text == "urgent" else {}),
            )
        )
    return sender, recipient


def _when(value: datetime, delivery: Delivery) -> frozenset[str]:
    """Which of the delivery's timestamp columns hold `value`."""
    return frozenset(
        f.attname
        for f in Delivery._meta.concrete_fields
        if isinstance(getattr(delivery, f.attname), datetime) and getattr(delivery, f.attname) == value
    )


def _written(sender: AgentSession, recipient: AgentSession) -> dict[str, Any]:
    """Every column the moves wrote for the recipient's deliveries and their audit events, with
    ids and times named by what they are: a time by the delivery's columns that hold it, an id by
    the message's text."""
    deliveries = {d.pk: d for d in Delivery.objects.filter(recipient=recipient).select_related("message")}
    text_of = {d.pk: d.message.text for d in deliveries.values()}
    names = {str(recipient.id): "recipient", str(sender.id): "sender"}
    actors = {session_principal(recipient).actor: "recipient"}
    written: dict[str, Any] = {}
    for d in deliveries.values():
        row = {}
        for f in Delivery._meta.concrete_fields:
            value = getattr(d, f.attname)
            if f.attname in ("id", "message_id", "recipient_id"):
                continue
            row[f.attname] = _when(value, d) if isinstance(value, datetime) else value
        written[f"delivery {d.message.text}"] = row
    for event in AuditEvent.objects.filter(delivery_id__in=deliveries).exclude(kind="delivery.queued"):
        d = deliveries[event.delivery_id]
        row = {}
        for f in AuditEvent._meta.concrete_fields:
            value = getattr(event, f.attname)
            if f.attname == "id":
                continue
            if f.attname == "at":
                value = _when(value, d)
            elif f.attname == "delivery_id":
                value = text_of[value]
            elif f.attname == "message_id":
                value = "its message" if value == d.message_id else value
            elif f.attname == "target":
                value = names.get(value, value)
            elif f.attname == "actor":
                value = actors.get(value, value)
            row[f.attname] = value
        written[f"{event.kind} {text_of[event.delivery_id]}"] = row
    return written


def _pulled_and_acked(sender: AgentSession, recipient: AgentSession, *, in_transaction: bool) -> int:
    """Pull the recipient's inbox, get one more message, then ack all four (one delivered, one
    queued): the portable moves in a transaction, PostgreSQL's one statements outside one.
    Returns how many statements the pull and the ack ran."""
    actor = session_principal(recipient)
    run = transaction.atomic if in_transaction else contextlib.nullcontext
    with CaptureQueriesContext(connection) as pull_queries, run():
        pulled = inbox_pull(recipient=recipient, actor=actor)
    late = message_send(SendRequest(sender=sender, to=recipient.name, text="late")).message
    ids = [str(d.message_id) for d in pulled] + [str(late.id)]
    with CaptureQueriesContext(connection) as ack_queries, run():
        answer = inbox_ack(recipient=recipient, actor=actor, message_ids=ids)
    assert sorted(answer["acked"]) == sorted(ids)
    return len(pull_queries) + len(ack_queries)


@pytest.mark.django_db(transaction=True)
def test_the_one_statement_pull_and_ack_write_the_columns_and_audit_the_portable_moves_write() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement pull and ack are PostgreSQL's")
    alice, bob = _sent("alice", "bob")
    dave, carol = _sent("dave", "carol")

    portable_statements = _pulled_and_acked(alice, bob, in_transaction=True)
    one_statements = _pulled_and_acked(dave, carol, in_transaction=False)

    assert one_statements == 2 and portable_statements > 2
    portable, fast = _written(alice, bob), _written(dave, carol)
    assert fast == portable
    # What both wrote, spelled out once: each state's timestamp is the move's, and so is its audit's.
    assert portable["delivery first"]["state"] == "read"
    assert portable["delivery first"]["delivered_at"] == {"delivered_at"}
    assert portable["delivery first"]["read_at"] == {"read_at", "updated_at"}
    assert portable["delivery late"]["delivered_at"] is None
    assert portable["delivery.delivered first"]["at"] == {"delivered_at"}
    assert portable["delivery.read first"]["at"] == {"read_at", "updated_at"}
    assert portable["delivery.read first"]["detail"] == {"from": "delivered"}
    assert portable["delivery.read late"]["detail"] == {"from": "queued"}
    assert portable["delivery.read late"]["target"] == "recipient"
    assert portable["delivery.read late"]["actor"] == "recipient"
