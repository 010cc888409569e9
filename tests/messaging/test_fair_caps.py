"""The per-recipient hold cap is fair between senders: a sender makes room only among its own
holds, so one sender flooding a recipient's holds cannot push out, or expire, another sender's
message waiting for an operator (docs/security.md)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from messaging.errors import SwitchboardError
from messaging.models import AgentSession, Delivery
from messaging.principals import session_principal
from messaging.services.pipeline import message_send, messages_send
from messaging.services.request import SendRequest


@pytest.fixture(autouse=True)
def _own_limit_keys(settings):
    """Each test gets its own rate-limit key space, so the buckets start full."""
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-limits-{uuid.uuid4().hex}"


@pytest.fixture
def hold_for(api, operator_token):
    """Given an operator has set `agent`'s inbound policy to hold."""

    def _hold(agent):
        r = api.call("PUT", f"sessions/{agent.id}/policy", operator_token, {"policy": "hold"})
        assert r.status_code == 200, r.json_body

    return _hold


def test_a_flood_of_holds_never_expires_another_senders_hold(
    api, register, send, hold_for, operator_token, settings
):
    settings.SWITCHBOARD_HOLDS_PER_RECIPIENT = 4
    alice, mallory, carol, bob = register("alice"), register("mallory"), register("carol"), register("bob")
    hold_for(bob)
    waiting = send(alice, "bob", "please review PR 12").json_body
    assert waiting["status"] == "held"
    # When Mallory sends far more than the cap, all of it held for Bob,
    for i in range(8):
        r = send(mallory, "bob", f"spam {i}")
        assert r.status_code == 201 and r.json_body["status"] == "held", r.json_body
    # then Alice's message still waits for the operator, and Mallory's overflow expired her own.
    assert api.get(f"messages/{waiting['id']}", alice.token).json_body["status"] == "held"
    holds = api.get("holds", operator_token, recipient=bob.id).json_body["holds"]
    senders = [h["sender"]["ref"] for h in holds]
    assert senders.count(alice.ref) == 1 and senders.count(mallory.ref) == 3 and len(holds) == 4
    overflowed = Delivery.objects.filter(recipient_id=bob.id, decision_reason="hold_overflow")
    assert {d.message.sender_id for d in overflowed.select_related("message")} == {uuid.UUID(mallory.id)}
    # And Carol, with no hold of her own to give up, is refused while the cap is full: nothing expires.
    expired = Delivery.objects.filter(recipient_id=bob.id, state="expired").count()
    r = send(carol, "bob", "one more")
    assert r.status_code == 429 and r.json_body["error"] == "hold_full", r.json_body
    assert "operator" in r.json_body["detail"]
    assert Delivery.objects.filter(recipient_id=bob.id, state="expired").count() == expired
    assert api.get(f"messages/{waiting['id']}", alice.token).json_body["status"] == "held"


def test_a_full_hold_cap_refuses_a_sender_with_no_hold_to_give_up(
    api, register, send, hold_for, operator_token, settings
):
    settings.SWITCHBOARD_HOLDS_PER_RECIPIENT = 4
    alice, mallory, carol, bob = register("alice"), register("mallory"), register("carol"), register("bob")
    hold_for(bob)
    for who in (alice, alice, mallory, mallory):
        assert send(who, "bob", f"from {who.name} {uuid.uuid4()}").json_body["status"] == "held"
    # When Bob's holds are full and Carol has none of them, Carol is refused: nobody's hold expires.
    r = send(carol, "bob", "one more")
    assert r.status_code == 429 and r.json_body["error"] == "hold_full"
    assert "operator" in r.json_body["detail"]
    assert not Delivery.objects.filter(recipient_id=bob.id, state="expired").exists()
    # Once an operator has decided one, Carol's next message is held.
    first = api.get("holds", operator_token, recipient=bob.id).json_body["holds"][0]
    assert api.post(f"holds/{first['id']}/deny", operator_token, {}).status_code == 200
    assert send(carol, "bob", "one more, later").json_body["status"] == "held"


def test_a_group_of_senders_makes_room_for_holds_as_sent_one_by_one(api, register, send, hold_for, settings):
    settings.SWITCHBOARD_HOLDS_PER_RECIPIENT = 2
    register("alice"), register("mallory"), register("carol")
    bob = register("bob")
    hold_for(bob)
    sessions = {s.name: s for s in AgentSession.objects.filter(name__in=["alice", "mallory", "carol"])}
    # When they send to Bob, whose messages are held, in one group (the hub's group commit),
    group = [
        SendRequest(sender=sessions[name], actor=session_principal(sessions[name]), to="bob", text=text)
        for name, text in [("alice", "a1"), ("mallory", "m1"), ("mallory", "m2"), ("carol", "c1")]
    ]
    outcomes = messages_send(group)
    # then each gets what it would one by one: Alice's and Mallory's first are held, Mallory's
    # second makes room with her first, and Carol, with none to give up, is refused.
    labels = [o.code if isinstance(o, SwitchboardError) else o.status for o in outcomes]
    assert labels == ["held", "held", "held", "hold_full"]
    states = {
        d.message.text: d.state
        for d in Delivery.objects.filter(recipient_id=bob.id).select_related("message")
    }
    assert states == {"a1": "held", "m1": "expired", "m2": "held"}


def test_a_hold_that_makes_room_counts_the_recipients_holds_once(register, send, hold_for, settings):
    """The send that expires the sender's oldest hold to make room for its new one reads the count
    of the recipient's holds once, and passes it on: the number of statements on that path is
    pinned (a second count of the same holds, in the same transaction, adds one)."""
    settings.SWITCHBOARD_HOLDS_PER_RECIPIENT = 2
    alice, bob = register("alice"), register("bob")
    hold_for(bob)
    for n in range(2):
        assert send(alice, "bob", f"held {n}").json_body["status"] == "held"
    sender = AgentSession.objects.get(pk=alice.id)

    with CaptureQueriesContext(connection) as queries:
        outcome = message_send(SendRequest(sender=sender, to="bob", text="one more"))

    assert outcome.delivery.state == "held"
    assert Delivery.objects.get(message__text="held 0").decision_reason == "hold_overflow"
    statements = [q["sql"] for q in queries.captured_queries]
    assert sum('AS "held"' in sql for sql in statements) == 1, statements  # `holds_counted`
    assert len(statements) == (17 if connection.vendor == "postgresql" else 19), statements
