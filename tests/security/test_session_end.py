"""Ending a session whose token leaked: an operator ends any session by id or ref, and its token
stops working at once; another session's token cannot end it."""

from __future__ import annotations

import pytest

from messaging.models import AgentSession, AuditEvent

pytestmark = pytest.mark.django_db


def test_an_operator_ends_a_session_by_ref_and_its_token_stops_working(api, register, operator_token):
    """Given bob's token leaked, when an operator ends bob, then every call with that token answers
    401, bob is exited and the operator's act is audited."""
    alice, bob = register("alice"), register("bob")
    assert api.get("sessions/me", bob.token).status_code == 200

    ended = api.post(f"sessions/{bob.ref}/end", operator_token)

    assert ended.status_code == 200, ended.json_body
    assert ended.json_body["status"] == "exited"
    assert api.get("sessions/me", bob.token).status_code == 401
    assert api.post("messages", bob.token, {"to": "alice", "message": "still me?"}).status_code == 401
    assert AgentSession.objects.get(pk=bob.id).status == "exited"
    event = AuditEvent.objects.filter(kind="session.status", target=bob.id).latest("id")
    assert event.detail["to"] == "exited" and event.actor.startswith("operator")
    assert api.get("sessions/me", alice.token).status_code == 200  # nobody else is touched


def test_an_operator_ends_a_session_by_id_and_an_exited_one_is_not_found(api, register, operator_token):
    bob = register("bob")
    assert api.post(f"sessions/{bob.id}/end", operator_token).status_code == 200
    again = api.post(f"sessions/{bob.id}/end", operator_token)
    assert again.status_code == 404 and again.json_body["error"] == "not_found"


def test_one_session_token_cannot_end_another_session(api, register):
    """The attack: a session token (a model's) tries to end a rival session."""
    alice, bob = register("alice"), register("bob")

    refused = api.post(f"sessions/{bob.ref}/end", alice.token)

    assert refused.status_code == 403
    assert api.get("sessions/me", bob.token).status_code == 200
    assert AgentSession.objects.get(pk=bob.id).status != "exited"


def test_a_session_may_end_itself_as_me(api, register):
    bob = register("bob")
    assert api.post("sessions/me/end", bob.token).json_body["status"] == "exited"
    assert api.get("sessions/me", bob.token).status_code == 401
