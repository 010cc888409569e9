"""Shutdown negotiation: approve stops the teammate, reject carries a reason, silence times out."""

from __future__ import annotations

from datetime import timedelta

import time_machine
from django.utils import timezone

from teams.models import FrameRequest
from teams.services.shutdown import shutdowns_expire_due
from tests.teams.conftest import frames_in


def _ask(api, crew, who="alice", reason="wrapping up"):
    asked = api.post(crew.path(f"/members/{crew.members[who]}/shutdown"), crew.lead.token, {"reason": reason})
    assert asked.status_code == 201, asked.json_body
    return asked.json_body


def test_approve_stops_the_teammate_and_later_messages_are_held_for_it(api, crew, send):
    asked = _ask(api, crew)
    [frame] = frames_in(api, crew.alice, "shutdown_request")
    request_id = frame["frame"]["request_id"]
    assert request_id == asked["request"]["id"] and frame["frame"]["reason"] == "wrapping up"

    answered = api.post(crew.path(f"/shutdown/{request_id}"), crew.alice.token, {"approve": True})
    assert answered.status_code == 201, answered.json_body
    assert api.get("sessions/me", crew.alice.token).json_body["status"] == "stopped"
    [response] = frames_in(api, crew.lead, "shutdown_response")
    assert response["frame"]["approve"] is True

    held = send(crew.lead, "alice", "one more thing")
    assert held.json_body["status"] == "held"


def test_reject_needs_a_reason_and_the_lead_gets_it(api, crew):
    request_id = _ask(api, crew)["request"]["id"]
    bare = api.post(crew.path(f"/shutdown/{request_id}"), crew.alice.token, {"approve": False})
    assert bare.status_code == 400 and bare.json_body["reason"] == "missing_reason"
    said_no = api.post(
        crew.path(f"/shutdown/{request_id}"),
        crew.alice.token,
        {"approve": False, "reason": "tests still running"},
    )
    assert said_no.status_code == 201
    [response] = frames_in(api, crew.lead, "shutdown_response")
    assert response["frame"]["approve"] is False and response["frame"]["reason"] == "tests still running"
    assert api.get("sessions/me", crew.alice.token).json_body["status"] == "idle"


def test_asking_twice_returns_the_open_request_without_a_second_frame(api, crew):
    first = _ask(api, crew)
    second = _ask(api, crew)
    assert second["request"]["id"] == first["request"]["id"] and second["repeated"] is True
    assert len(frames_in(api, crew.alice, "shutdown_request")) == 1


def test_an_unanswered_request_times_out_once_into_a_clear_state(api, crew, settings):
    request_id = _ask(api, crew)["request"]["id"]
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_SHUTDOWN_TIMEOUT_SECONDS + 1)
    with time_machine.travel(later, tick=False):
        assert shutdowns_expire_due() == 1
        assert shutdowns_expire_due() == 0
        late = api.post(crew.path(f"/shutdown/{request_id}"), crew.alice.token, {"approve": True})
    assert late.status_code == 409 and late.json_body["reason"] == "stale_frame"
    assert FrameRequest.objects.get(pk=request_id).state == "expired"
    assert frames_in(api, crew.alice, "shutdown_request") == []  # the stale request never reaches it
    assert api.get("sessions/me", crew.alice.token).json_body["status"] == "idle"
    told = [m for m in frames_in(api, crew.lead) if m["kind"] == "notification"]
    assert len(told) == 1 and "NOT stopped" in told[0]["text"]
    assert _ask(api, crew)["request"]["id"] != request_id  # a new request can be made


def test_only_the_lead_asks(api, crew):
    asked = api.post(crew.path(f"/members/{crew.members['bob']}/shutdown"), crew.alice.token, {})
    assert asked.status_code == 403


def test_a_user_stopped_teammate_is_refused_not_held(api, crew, send):
    from messaging.models import AgentSession
    from messaging.principals import operator_principal
    from messaging.services.sessions import session_set_status

    session = AgentSession.objects.get(pk=crew.bob.id)
    session_set_status(session=session, status="user_stopped", actor=operator_principal("ops"))
    refused = send(crew.lead, "bob", "are you there?")
    assert refused.status_code == 201 and refused.json_body["status"] == "refused"


def test_ending_the_team_withdraws_an_unread_shutdown_request(api, crew):
    _ask(api, crew)
    api.post(crew.path("/end"), crew.lead.token)
    assert frames_in(api, crew.alice, "shutdown_request") == []
    assert FrameRequest.objects.get().state == "cancelled"


def test_a_shutdown_request_is_read_before_older_messages(api, crew, send):
    send(crew.bob, "alice", "an older chat message")
    _ask(api, crew)
    first, second = frames_in(api, crew.alice)
    assert first["frame_type"] == "shutdown_request" and first["priority"] == "urgent"
    assert second["text"] == "an older chat message"


def test_two_racing_shutdown_requests_open_one(api, crew, monkeypatch):
    """The second asker misses the first's request on its read (as in a race) and hits the unique
    index instead: it still gets the first request back, and only one frame is sent."""
    from teams.services import frames

    first = _ask(api, crew)["request"]["id"]
    real = frames._open_shutdown
    calls = {"n": 0}

    def blind_once(recipient, now):
        calls["n"] += 1
        return None if calls["n"] == 1 else real(recipient, now)

    monkeypatch.setattr(frames, "_open_shutdown", blind_once)
    second = _ask(api, crew)
    assert second["request"]["id"] == first and second["repeated"] is True
    assert len(frames_in(api, crew.alice, "shutdown_request")) == 1
