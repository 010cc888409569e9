"""A turn's boundaries in one request each (what the Claude Code hooks use): ending a turn
(`PATCH /sessions/me` with `unless_inbox`) and starting one (`GET /inbox?status=busy`)."""

from __future__ import annotations

import json

from messaging.models import AgentSession, AuditEvent, Delivery, Message
from tests.teams.conftest import join_team


def end_turn(api, agent, final_answer="", **fields):
    body = {"status": "idle", "final_answer": final_answer, "unless_inbox": True, **fields}
    response = api.patch("sessions/me", agent.token, body)
    assert response.status_code == 200, response.json_body
    return response.json_body


# --- ending a turn ------------------------------------------------------------------------------


def test_ending_a_turn_with_nothing_waiting_goes_idle_with_the_final_answer(api, register):
    bob = register("bob", status="busy")

    out = end_turn(api, bob, "Fixed the rounding bug.")

    assert (out["status"], out["messages"]) == ("idle", [])
    row = AgentSession.objects.get(pk=bob.id)
    assert (row.status, row.final_answer) == ("idle", "Fixed the rounding bug.")
    assert AuditEvent.objects.filter(kind="session.status", target=bob.id).count() == 1


def test_ending_a_turn_with_messages_waiting_returns_them_and_stays_busy(api, register, send):
    alice, bob = register("alice"), register("bob", status="busy")
    ids = [send(alice, "bob", f"note {i}").json_body["id"] for i in range(3)]

    out = end_turn(api, bob, "All done.", limit=2)

    assert out["status"] == "busy"
    assert [m["id"] for m in out["messages"]] == ids[:2]
    assert out["messages"][0]["text"] == "note 0" and "FROM=" in out["messages"][0]["marker"]
    states = {str(m): state for m, state in Delivery.objects.values_list("message_id", "state")}
    assert [states[i] for i in ids] == ["delivered", "delivered", "queued"]
    row = AgentSession.objects.get(pk=bob.id)
    assert (row.status, row.final_answer) == ("busy", "")  # the turn did not end: no final answer
    # The next attempt gets the rest; the one after that goes idle.
    assert [m["id"] for m in end_turn(api, bob, "All done.")["messages"]] == ids[2:]
    assert end_turn(api, bob, "All done.")["status"] == "idle"


def test_unless_inbox_only_goes_with_idle_and_plain_patches_are_unchanged(api, register, send):
    alice, bob = register("alice"), register("bob", status="busy")
    send(alice, "bob", "waiting")

    refused = api.patch("sessions/me", bob.token, {"status": "busy", "unless_inbox": True})
    assert refused.status_code == 400 and refused.json_body["reason"] == "bad_status"
    bad_limit = api.patch("sessions/me", bob.token, {"status": "idle", "unless_inbox": True, "limit": 0})
    assert bad_limit.status_code == 400 and bad_limit.json_body["reason"] == "bad_limit"

    plain = api.patch("sessions/me", bob.token, {"status": "idle", "final_answer": "x"}).json_body
    assert (plain["status"], plain["messages"]) == ("idle", None)
    assert Delivery.objects.get().state == "queued"  # a plain status report pulls nothing


def test_a_teammate_ending_its_turn_in_one_call_still_notifies_its_lead(api, register):
    lead, alice = register("lead-one"), register("alice", status="busy")
    team = api.post("teams", lead.token, {"name": "build"}).json_body
    join_team(api, lead, team["id"], alice)

    end_turn(api, alice, "Schema migrated.")

    notes = [m for m in api.get("inbox", lead.token).json_body["messages"] if m.get("frame_type")]
    assert [m["frame_type"] for m in notes] == ["idle_notification"]
    assert json.loads(notes[0]["text"])["final_answer"] == "Schema migrated."


def test_a_teammate_kept_busy_by_waiting_messages_does_not_notify_its_lead(api, register, send):
    lead, alice = register("lead-one"), register("alice", status="busy")
    team = api.post("teams", lead.token, {"name": "build"}).json_body
    join_team(api, lead, team["id"], alice)
    send(lead, "alice", "one more thing")

    assert end_turn(api, alice, "Done?")["messages"]

    assert Message.objects.filter(frame_type="idle_notification").count() == 0


# --- starting a turn ----------------------------------------------------------------------------


def test_an_inbox_pull_with_status_busy_starts_a_turn_in_the_same_request(api, register, send):
    alice, bob = register("alice"), register("bob")  # idle
    sent = send(alice, "bob", "ping").json_body["id"]

    pulled = api.get("inbox", bob.token, status="busy")

    assert pulled.status_code == 200
    assert [m["id"] for m in pulled.json_body["messages"]] == [sent]
    assert AgentSession.objects.get(pk=bob.id).status == "busy"
    assert Delivery.objects.get().state == "delivered"
    assert AuditEvent.objects.filter(kind="session.status", target=bob.id).count() == 1
    # Nothing waiting: it still reports busy, and answers an empty list.
    api.patch("sessions/me", bob.token, {"status": "idle"})
    again = api.get("inbox", bob.token, status="busy").json_body
    assert again == {"messages": []} and AgentSession.objects.get(pk=bob.id).status == "busy"


def test_a_stopped_session_starting_a_turn_gets_what_was_held_for_it(api, register, send):
    alice, bob = register("alice"), register("bob", status="stopped")
    send(alice, "bob", "while you were stopped")
    assert Delivery.objects.get().state == "held"

    messages = api.get("inbox", bob.token, status="busy").json_body["messages"]

    assert [m["text"] for m in messages] == ["while you were stopped"]
    assert Delivery.objects.get().state == "delivered"


def test_an_inbox_pull_reports_no_status_but_busy(api, register):
    bob = register("bob")

    refused = api.get("inbox", bob.token, status="exited")

    assert refused.status_code == 400 and refused.json_body["reason"] == "bad_status"
    assert AgentSession.objects.get(pk=bob.id).status == "idle"
