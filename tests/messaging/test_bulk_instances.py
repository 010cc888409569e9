"""Rows built by `bulk` (for rows about to be written, and rows read with plain SQL) are the
instances the ORM would build, without going through Model.__init__."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.db.models import signals
from django.utils import timezone

from messaging.models import Delivery, Message
from messaging.services import bulk
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register


@pytest.mark.django_db
def test_an_instance_built_from_a_row_is_the_one_from_db_builds() -> None:
    alice = session_register(name="alice").session
    session_register(name="bob")
    sent = message_send(SendRequest(sender=alice, to="bob", text="hello"))
    stored = Delivery.objects.get(pk=sent.delivery.pk)
    row = [getattr(stored, name) for name in bulk.model_columns(Delivery)]

    built = bulk._built(Delivery, list(row))
    expected = Delivery.from_db(connection.alias, None, list(row))

    assert type(built) is Delivery and built.__dict__.keys() - {"_state"} == expected.__dict__.keys() - {
        "_state"
    }
    for name in bulk.model_columns(Delivery):
        assert getattr(built, name) == getattr(expected, name), name
    assert (built._state.adding, built._state.db) == (False, connection.alias)
    assert built.message == sent.message and built.recipient.name == "bob"  # relations load as usual
    built.save(update_fields=["last_error"])  # and it saves as an instance that was read


@pytest.mark.django_db
def test_with_an_init_signal_listening_instances_are_built_by_the_orm() -> None:
    seen: list[object] = []

    def note(sender: type, **kwargs: object) -> None:
        seen.append(sender)

    signals.post_init.connect(note, sender=Message)
    try:
        now = timezone.now()
        bulk.model_instance(Message, {"id": uuid.uuid4(), "text": "x", "created_at": now, "updated_at": now})
    finally:
        signals.post_init.disconnect(note, sender=Message)
    assert seen == [Message]


def test_json_for_the_database_writes_uuids_and_datetimes_as_text() -> None:
    ident, when = uuid.uuid4(), timezone.now()
    assert json.loads(bulk.json_text([{"id": ident, "at": when, "n": 1, "text": "é"}])) == [
        {"id": str(ident), "at": when.isoformat(), "n": 1, "text": "é"}
    ]


@pytest.mark.django_db
def test_bulk_insert_writes_every_row_and_returns_ids_in_row_order() -> None:
    # More rows than SQLite takes parameters for in one statement: several statements there
    alice = session_register(name="alice").session
    session_register(name="bob")
    sent = message_send(SendRequest(sender=alice, to="bob", text="template"))
    message_row = bulk.model_row(sent.message, bulk.model_columns(Message))
    delivery_row = bulk.model_row(sent.delivery, bulk.model_columns(Delivery)[1:])  # the database gives ids
    new_ids = [uuid.uuid4() for _ in range(300)]
    bulk.bulk_insert(
        model=Message,
        rows=[
            {**message_row, "id": mid, "text": f"copy {i}", "sha256": f"{i:064x}"}
            for i, mid in enumerate(new_ids)
        ],
    )

    given = bulk.bulk_insert(
        model=Delivery, rows=[{**delivery_row, "message_id": mid} for mid in new_ids], returning="id"
    )

    assert len(given) == len(set(given)) == 300
    stored = dict(Delivery.objects.filter(pk__in=given).values_list("pk", "message_id"))
    assert [stored[pk] for pk in given] == new_ids
    assert list(Message.objects.filter(pk__in=new_ids).order_by("text").values_list("text", flat=True))[
        :2
    ] == [
        "copy 0",
        "copy 1",
    ]
