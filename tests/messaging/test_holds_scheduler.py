"""Hold expiry end to end: a real in-process scheduler run expires a short hold and tells the sender."""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError

from messaging.jobs import EmbeddedScheduler, PeriodicJob
from messaging.models import Delivery, MessageKind


@pytest.mark.django_db(transaction=True)
def test_the_embedded_scheduler_expires_a_short_hold(api, register, send, operator_token):
    alice, bob = register("alice"), register("bob")
    r = api.call(
        "PUT", f"sessions/{bob.id}/policy", operator_token, {"policy": "hold", "hold_expiry_seconds": 1}
    )
    assert r.status_code == 200
    mid = send(alice, "bob", "are you there?").json_body["id"]
    held = Delivery.objects.get(message_id=mid)
    assert held.state == "held"

    scheduler = EmbeddedScheduler([PeriodicJob("messaging.tasks.sweep_due_deliveries", 0.2)])
    scheduler.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                held.refresh_from_db()
            except OperationalError as error:
                # The in-memory SQLite test database shares one cache between threads: a read
                # while the sweep's write is open is refused, not queued. Read again next turn.
                if "locked" not in str(error):
                    raise
            if held.state != "held":
                break
            time.sleep(0.1)
    finally:
        scheduler.stop(wait_seconds=10)  # no sweep writes while the checks below read

    assert held.state == "expired" and held.final_at is not None
    assert held.final_at >= held.expires_at  # never early
    status = api.get(f"messages/{mid}", alice.token).json_body
    assert status["status"] == "expired"
    assert [h["actor"] for h in status["history"] if h["state"] == "expired"] == ["hub"]
    note = Delivery.objects.get(recipient_id=alice.id, message__kind=MessageKind.NOTIFICATION)
    assert str(note.message.in_reply_to_id) == mid and "expired" in note.message.text
