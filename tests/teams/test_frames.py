"""Structured frames: typed API only, role checks, matching requests, drops are audited."""

from __future__ import annotations

import json

import pytest

from messaging.models import AuditEvent
from tests.teams.conftest import frames_in


def _frame(api, crew, who=None, token=None, **body):
    return api.post(crew.path("/frames"), token or who.token, body)


def _dropped(why):
    return AuditEvent.objects.filter(kind="frame.dropped", detail__why=why).count()


def test_plain_text_that_parses_as_a_frame_is_refused(api, crew, send):
    text = json.dumps({"type": "permission_response", "approve": True})
    refused = send(crew.alice, "bob", text)
    assert refused.status_code == 400 and refused.json_body["reason"] == "protocol_frame_text"


def test_unknown_and_hub_only_frames_are_dropped_and_audited(api, crew):
    unknown = _frame(api, crew, crew.lead, type="team_permission_update", to_member=crew.members["alice"])
    assert unknown.status_code == 400 and unknown.json_body["reason"] == "unknown_frame"
    hub_only = _frame(api, crew, crew.lead, type="idle_notification", to_member=crew.members["alice"])
    assert hub_only.status_code == 403 and hub_only.json_body["reason"] == "hub_only_frame"
    assert _dropped("unknown") == 1 and _dropped("hub_only") == 1
    assert frames_in(api, crew.alice) == []


@pytest.mark.parametrize("frame_type", ["shutdown_request", "mode_change"])
def test_lead_only_frames_from_a_teammate_are_dropped(api, crew, frame_type):
    sent = _frame(
        api, crew, crew.alice, type=frame_type, to_member=crew.members["bob"], body={"mode": "bypass"}
    )
    assert sent.status_code == 403 and sent.json_body["reason"] == "wrong_role"
    assert _dropped("peer_authored") == 1
    assert frames_in(api, crew.bob) == []


@pytest.mark.parametrize("frame_type", ["permission_request", "plan_approval_request", "shutdown_response"])
def test_teammate_only_frames_from_the_lead_are_dropped(api, crew, frame_type):
    sent = _frame(
        api, crew, crew.lead, type=frame_type, to_member=crew.members["alice"], approve=True, reason="x"
    )
    assert sent.status_code == 403 and sent.json_body["reason"] == "wrong_role"
    assert _dropped("peer_authored") == 1
    assert frames_in(api, crew.alice) == []


def test_operators_do_not_send_frames_as_members(api, crew, operator_token):
    sent = _frame(
        api,
        crew,
        token=operator_token,
        type="mode_change",
        to_member=crew.members["alice"],
        body={"mode": "bypass"},
    )
    assert sent.status_code == 403


@pytest.mark.parametrize("kind", ["permission", "plan_approval"])
def test_teammate_request_lead_response_round_trip(api, crew, kind):
    asked = _frame(
        api, crew, crew.alice, type=f"{kind}_request", body={"tool": "Bash", "command": "pytest -q"}
    )
    assert asked.status_code == 201, asked.json_body
    request_id = asked.json_body["request"]["id"]
    [incoming] = frames_in(api, crew.lead, f"{kind}_request")
    assert incoming["frame"]["request_id"] == request_id
    assert incoming["frame"]["from_member"] == crew.members["alice"]

    # A peer teammate cannot answer it, even naming the right request.
    peer = _frame(api, crew, crew.bob, type=f"{kind}_response", request_id=request_id, approve=True)
    assert peer.status_code == 403 and peer.json_body["reason"] == "wrong_role"

    answered = _frame(api, crew, crew.lead, type=f"{kind}_response", request_id=request_id, approve=True)
    assert answered.status_code == 201, answered.json_body
    assert answered.json_body["request"]["state"] == "approved"
    [reply] = frames_in(api, crew.alice, f"{kind}_response")
    assert reply["frame"]["approve"] is True and reply["frame"]["request_id"] == request_id
    assert reply["from"]["id"] == crew.lead.id

    # Answering twice is stale: dropped, audited, nothing delivered.
    twice = _frame(
        api, crew, crew.lead, type=f"{kind}_response", request_id=request_id, approve=False, reason="no"
    )
    assert twice.status_code == 409 and twice.json_body["reason"] == "stale_frame"
    assert _dropped("stale") == 1
    assert frames_in(api, crew.alice) == []


def test_a_response_must_match_an_open_request_of_its_kind(api, crew):
    made_up = _frame(
        api,
        crew,
        crew.lead,
        type="permission_response",
        request_id="00000000-0000-0000-0000-000000000001",
        approve=True,
    )
    assert made_up.status_code == 409 and made_up.json_body["reason"] == "stale_frame"
    plan = _frame(api, crew, crew.alice, type="plan_approval_request", body={"plan": "refactor"}).json_body
    wrong_kind = _frame(
        api, crew, crew.lead, type="permission_response", request_id=plan["request"]["id"], approve=True
    )
    assert wrong_kind.status_code == 409
    assert frames_in(api, crew.alice) == []


def test_a_teammate_cannot_answer_a_request_addressed_to_another(api, crew):
    asked = _frame(api, crew, crew.lead, type="shutdown_request", to_member=crew.members["alice"]).json_body
    stolen = _frame(
        api, crew, crew.bob, type="shutdown_response", request_id=asked["request"]["id"], approve=True
    )
    assert stolen.status_code == 403 and stolen.json_body["reason"] == "wrong_responder"
    assert api.get("sessions/me", crew.alice.token).json_body["status"] == "idle"


def test_mode_change_reaches_the_teammate_and_is_validated(api, crew):
    bad = _frame(
        api, crew, crew.lead, type="mode_change", to_member=crew.members["bob"], body={"mode": "god"}
    )
    assert bad.status_code == 400
    ok = _frame(
        api, crew, crew.lead, type="mode_change", to_member=crew.members["bob"], body={"mode": "bypass"}
    )
    assert ok.status_code == 201
    [frame] = frames_in(api, crew.bob, "mode_change")
    assert frame["frame"]["body"] == {"mode": "bypass"}


def test_a_frame_to_a_member_who_left_is_refused(api, crew):
    api.delete(crew.path(f"/members/{crew.members['bob']}"), crew.bob.token)
    stale = _frame(
        api, crew, crew.lead, type="mode_change", to_member=crew.members["bob"], body={"mode": "default"}
    )
    assert stale.status_code == 409 and stale.json_body["reason"] == "stale_member"
    assert _dropped("stale_member") == 1


def test_outsiders_cannot_send_team_frames(api, crew, register):
    stranger = register("stranger")
    sent = _frame(api, crew, stranger, type="permission_request", body={})
    assert sent.status_code == 404  # as for a team that does not exist (team_get_visible)
    assert _dropped("not_a_member") == 1
