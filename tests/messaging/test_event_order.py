"""A change's live events leave the process in one hand-off, the recipient's push first, and before
any work the push starts. Otherwise the recipient could pull (or a socket write finish) and its
`delivered` receipt reach the sender, or the console, ahead of the sender's own `message.sent`."""

from __future__ import annotations

from typing import Any

import pytest

from messaging import jobs
from messaging.models import AgentSession
from messaging.services import events
from messaging.services.events import OPERATORS_GROUP, session_group
from messaging.services.pipeline import message_send, messages_send_batch
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register

pytestmark = pytest.mark.django_db


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """In order: each hand-off to the publisher as [(group, kind), ...] (a bundle's kinds in order),
    and each background job started, as ("job", task name)."""
    seen: list[Any] = []

    def handed(batch: list[tuple[list[str], dict[str, Any]]]) -> None:
        seen.append(
            [
                (group, [e["kind"] for e in event["events"]] if "events" in event else event["kind"])
                for groups, event in batch
                for group in groups
            ]
        )

    monkeypatch.setattr(events, "_send_many", handed)
    monkeypatch.setattr(jobs, "_submit", lambda task_name, args: seen.append(("job", task_name)))
    return seen


def _session(name: str, **fields: Any) -> AgentSession:
    return session_register(name=name, **fields).session


def test_a_send_hands_over_the_push_and_the_senders_notice_together(
    hand_offs: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    alice, bob = _session("alice"), _session("bob")

    with django_capture_on_commit_callbacks(execute=True):
        message_send(SendRequest(sender=alice, to="bob", text="hello"))

    assert hand_offs == [
        [
            (session_group(bob.id), "inbox.queued"),
            (session_group(alice.id), "message.sent"),
            (OPERATORS_GROUP, "message.sent"),
        ]
    ]


def test_a_socket_write_starts_only_after_the_events_are_handed_over(
    hand_offs: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    alice = _session("alice")
    bob = _session("bob", peer_address="uds:/tmp/switchboard-test-bob.sock")

    with django_capture_on_commit_callbacks(execute=True):
        message_send(SendRequest(sender=alice, to="bob", text="hello"))

    assert len(hand_offs) == 2
    assert hand_offs[0][0] == (session_group(bob.id), "inbox.queued")
    assert hand_offs[1] == ("job", "messaging.tasks.deliver_to_socket")


def test_a_held_send_hands_over_only_the_senders_notice(
    hand_offs: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    alice, bob = _session("alice"), _session("bob")
    AgentSession.objects.filter(pk=bob.id).update(inbound_policy="hold")

    with django_capture_on_commit_callbacks(execute=True):
        message_send(SendRequest(sender=alice, to="bob", text="hello"))

    assert hand_offs == [[(session_group(alice.id), "message.sent"), (OPERATORS_GROUP, "message.sent")]]


def test_a_batch_hands_over_every_push_and_notice_together(
    hand_offs: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    alice, bob, carol = _session("alice"), _session("bob"), _session("carol")

    with django_capture_on_commit_callbacks(execute=True):
        messages_send_batch(
            sender=alice,
            items=[
                {"to": "bob", "text": "one"},
                {"to": "carol", "text": "two"},
                {"to": "bob", "text": "three"},
            ],
        )

    assert hand_offs == [
        [
            (session_group(bob.id), "inbox.queued"),  # one wake-up per recipient
            (session_group(carol.id), "inbox.queued"),
            (session_group(alice.id), ["message.sent"] * 3),
            (OPERATORS_GROUP, ["message.sent"] * 3),
        ]
    ]
