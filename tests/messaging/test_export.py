"""Conversation export core: which messages a pair's export holds, in what order, and how held,
denied and sensitive messages are marked; the two renderers; the audit; batching."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from messaging.errors import Forbidden, Invalid, NotFound
from messaging.models import AgentSession, AuditEvent
from messaging.principals import HUB, operator_principal
from messaging.services import export
from messaging.services.export import (
    export_pair_scope,
    export_records,
    export_stream,
    parse_when,
    session_by_id_or_ref,
)
from messaging.services.holds import holds_decide
from messaging.services.pipeline import message_send
from messaging.services.policies import policy_set
from messaging.services.request import HUB_MADE, SendRequest
from messaging.services.sessions import session_register

pytestmark = pytest.mark.django_db
OP = operator_principal("op")
AWS_KEY = "AKIAABCDEFGHIJKLMNOP"


@pytest.fixture
def trio() -> tuple[AgentSession, AgentSession, AgentSession]:
    """alice, bob and carol, live."""
    return tuple(session_register(name=n).session for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def _jsonl(scope, **kwargs):
    return [
        json.loads(line)
        for line in "".join(export_stream(scope, fmt="jsonl", actor=OP, **kwargs)).splitlines()
    ]


def test_a_pair_export_holds_both_directions_in_time_order_and_nothing_else(trio):
    alice, bob, carol = trio
    first = message_send(SendRequest(sender=alice, to="bob", text="hello bob", summary="greeting")).message
    message_send(SendRequest(sender=alice, to="carol", text="not for this pair"))
    reply = message_send(
        SendRequest(sender=bob, to="alice", text="hi alice", in_reply_to=str(first.pk))
    ).message
    message_send(SendRequest(sender=carol, to="bob", text="also not"))

    records = _jsonl(export_pair_scope(a=alice, b=bob))

    assert [r["text"] for r in records] == ["hello bob", "hi alice"]
    assert records[0]["sender"] == {"id": str(alice.pk), "name": "alice", "ref": alice.ref}
    [to_bob] = records[0]["recipients"]
    assert to_bob["ref"] == bob.ref and to_bob["state"] == "queued"
    assert records[0]["summary"] == "greeting" and records[0]["kind"] == "text"
    assert records[0]["tier"] == "info" and records[0]["trust"] == "host-verified"
    assert records[1]["id"] == str(reply.pk) and records[1]["in_reply_to"] == str(first.pk)
    assert records[0]["created_at"] <= records[1]["created_at"]
    assert set(records[0]) >= {"id", "created_at", "sender", "recipients", "summary", "in_reply_to", "kind"}


def test_the_time_range_is_since_inclusive_until_exclusive(trio):
    alice, bob, _ = trio
    start = timezone.now()
    with time_machine.travel(start - timedelta(days=2), tick=False):
        message_send(SendRequest(sender=alice, to="bob", text="old", origin=HUB_MADE))
    with time_machine.travel(start - timedelta(days=1), tick=False):
        message_send(SendRequest(sender=alice, to="bob", text="middle", origin=HUB_MADE))
    message_send(SendRequest(sender=alice, to="bob", text="new", origin=HUB_MADE))

    scope = export_pair_scope(
        a=alice, b=bob, since=start - timedelta(days=1), until=start - timedelta(hours=1)
    )
    assert [r["text"] for r in _jsonl(scope)] == ["middle"]


def test_held_and_denied_messages_are_marked_and_their_text_withheld_unless_asked(trio):
    alice, bob, _ = trio
    policy_set(session=bob, policy="hold", actor=OP)
    held = message_send(SendRequest(sender=alice, to="bob", text="secret plan A", summary="plan A"))
    denied = message_send(SendRequest(sender=alice, to="bob", text="secret plan B"))
    holds_decide(delivery_ids=[denied.delivery.pk], approve=False, actor=OP, reason="not now")
    assert held.status == "held"

    records = _jsonl(export_pair_scope(a=alice, b=bob))
    assert [(r["withheld"], r["text"], r["text_exported"]) for r in records] == [
        ("held", "[held — text not exported]", False),
        ("denied", "[denied — text not exported]", False),
    ]
    assert records[0]["summary"] == ""
    assert records[1]["recipients"][0]["decided_by"] == OP.actor
    assert records[1]["recipients"][0]["decision_reason"] == "not now"

    shown = _jsonl(export_pair_scope(a=alice, b=bob), include_held=True)
    assert [r["text"] for r in shown] == ["secret plan A", "secret plan B"]
    assert all(r["withheld"] and r["text_exported"] for r in shown)


def test_a_sensitive_messages_secrets_are_masked_even_with_held_text_included(trio):
    alice, bob, _ = trio
    sent = message_send(
        SendRequest(sender=alice, to="bob", text=f"use {AWS_KEY} for the deploy", summary=f"key {AWS_KEY}")
    )
    assert sent.message.tier == "sensitive"

    for include_held in (False, True):
        [record] = _jsonl(export_pair_scope(a=alice, b=bob), include_held=include_held)
        assert record["masked"] is True and record["tier"] == "sensitive"
        assert AWS_KEY not in json.dumps(record)
        if include_held:
            assert record["text"].startswith("use [") and record["text"].endswith("] for the deploy")
    markdown = "".join(
        export_stream(export_pair_scope(a=alice, b=bob), fmt="md", actor=OP, include_held=True)
    )
    assert AWS_KEY not in markdown and "**masked**" in markdown


def test_the_markdown_transcript_shows_states_decisions_and_fences_the_text(trio):
    alice, bob, _ = trio
    first = message_send(
        SendRequest(sender=alice, to="bob", text="look: ```not a fence end``` # not a heading")
    ).message
    policy_set(session=alice, policy="hold", actor=OP)
    denied = message_send(SendRequest(sender=bob, to="alice", text="done", in_reply_to=str(first.pk)))
    holds_decide(delivery_ids=[denied.delivery.pk], approve=False, actor=OP, reason="too soon")

    text = "".join(export_stream(export_pair_scope(a=alice, b=bob), fmt="md", actor=OP))

    assert text.startswith("# Conversation: ")
    assert f"alice [{alice.ref}] → bob [{bob.ref}]" in text
    assert f"bob [{bob.ref}] → alice [{alice.ref}]" in text
    assert "````text\nlook: ```not a fence end``` # not a heading\n````" in text
    assert f"in reply to `{first.pk}`" in text and "**denied**" in text
    assert f"- alice [{alice.ref}]: denied (operator_policy), decided by {OP.actor}: too soon" in text
    assert "[denied — text not exported]" in text and "\ndone\n" not in text
    assert text.index("look:") < text.index("[denied")


def test_an_export_is_audited_with_counts_and_never_text(trio):
    alice, bob, _ = trio
    policy_set(session=bob, policy="hold", actor=OP)
    message_send(SendRequest(sender=alice, to="bob", text="sixteen characters"))
    message_send(SendRequest(sender=bob, to="alice", text="an answer"))

    _jsonl(export_pair_scope(a=alice, b=bob))

    [event] = AuditEvent.objects.filter(kind="conversation.exported")
    assert event.actor == "operator:op" and event.target.startswith("pair:")
    assert event.detail["messages"] == 2 and event.detail["withheld"] == 1
    assert event.detail["complete"] is True and event.detail["format"] == "jsonl"
    assert "sixteen" not in json.dumps(event.detail) and "answer" not in json.dumps(event.detail)


def test_an_export_cut_short_is_audited_as_incomplete(trio):
    alice, bob, _ = trio
    message_send(SendRequest(sender=alice, to="bob", text="one"))
    message_send(SendRequest(sender=alice, to="bob", text="two"))
    chunks = export_stream(export_pair_scope(a=alice, b=bob), fmt="jsonl", actor=OP)
    next(chunks)
    chunks.close()
    [event] = AuditEvent.objects.filter(kind="conversation.exported")
    assert event.detail["complete"] is False and event.detail["messages"] == 1


def test_batches_read_every_message_once_in_order(trio, monkeypatch):
    alice, bob, _ = trio
    monkeypatch.setattr(export, "BATCH", 3)
    now = timezone.now()
    with time_machine.travel(now, tick=False):  # equal created_at: the id breaks the tie
        for i in range(4):
            message_send(SendRequest(sender=alice, to="bob", text=f"same time {i}", origin=HUB_MADE))
    for i in range(4):
        message_send(SendRequest(sender=bob, to="alice", text=f"later {i}", origin=HUB_MADE))

    records = list(export_records(export_pair_scope(a=alice, b=bob)))
    assert len(records) == 8 and len({r["id"] for r in records}) == 8
    keys = [(r["created_at"], r["id"]) for r in records]
    assert keys[:4] == sorted(keys[:4]) and keys[3][0] <= keys[4][0]


def test_only_an_operator_exports_and_bad_input_is_refused(trio):
    alice, bob, _ = trio
    with pytest.raises(Forbidden):
        export_stream(export_pair_scope(a=alice, b=bob), fmt="jsonl", actor=HUB)
    with pytest.raises(Invalid):
        export_stream(export_pair_scope(a=alice, b=bob), fmt="csv", actor=OP)
    with pytest.raises(Invalid):
        export_pair_scope(a=alice, b=alice)
    with pytest.raises(Invalid):
        export_pair_scope(a=alice, b=bob, since=timezone.now(), until=timezone.now() - timedelta(days=1))
    with pytest.raises(Invalid):
        parse_when("yesterday", name="--since")
    with pytest.raises(NotFound):
        session_by_id_or_ref("nope")
    assert session_by_id_or_ref(alice.ref) == alice == session_by_id_or_ref(str(alice.pk))
    assert parse_when("2026-01-31", name="x").isoformat() == "2026-01-31T00:00:00+00:00"
