"""The story from issue 4, end to end through the REST API: a lead, two teammates, a board with
dependencies, idle reports with final answers, a subscription, and a negotiated shutdown."""

from __future__ import annotations

from tests.teams.conftest import frames_in, join_team


def test_a_lead_runs_a_small_team_from_board_to_shutdown(api, register, operator_token):
    lead, ana, ben = register("lead-story"), register("ana"), register("ben")

    # The lead builds the team and the board: "api" waits on "schema".
    team = api.post("teams", lead.token, {"name": "story"}).json_body
    path = f"teams/{team['id']}"
    ids = {a.name: join_team(api, lead, team["id"], a)["member_id"] for a in (ana, ben)}
    schema = api.post(f"{path}/tasks", lead.token, {"title": "schema"}).json_body
    api_task = api.post(f"{path}/tasks", lead.token, {"title": "api", "blocked_by": [schema["id"]]}).json_body

    # Both teammates ask for work at once; only the unblocked task is handed out, to one of them.
    first = api.post("tasks/claim-next", ana.token).json_body["task"]
    second = api.post("tasks/claim-next", ben.token).json_body["task"]
    assert first["id"] == schema["id"] and second is None

    # Ana finishes; the api task unblocks; Ben takes it; the lead subscribes to Ben's next idle.
    api.patch("sessions/me", ana.token, {"status": "busy"})
    api.post(f"tasks/{schema['id']}/complete", ana.token, {"result": "tables created"})
    api.patch("sessions/me", ana.token, {"status": "idle", "final_answer": "schema is in"})
    assert api.post("tasks/claim-next", ben.token).json_body["task"]["id"] == api_task["id"]
    api.patch("sessions/me", ben.token, {"status": "busy"})
    assert api.post("teams/subscriptions", lead.token, {"target": ben.id}).json_body["state"] == "waiting"
    api.post(f"tasks/{api_task['id']}/complete", ben.token, {})
    api.patch("sessions/me", ben.token, {"status": "idle", "final_answer": "endpoints done"})

    # The lead heard each teammate's final answer, and its subscription fired once.
    inbox = frames_in(api, lead)
    idle = [m["frame"]["final_answer"] for m in inbox if m.get("frame_type") == "idle_notification"]
    assert idle == ["schema is in", "endpoints done"]
    assert [m for m in inbox if m["kind"] == "notification" and "endpoints done" in m["text"]]

    # Shutdown: Ana agrees; Ben says no, with a reason.
    asks = {
        name: api.post(f"{path}/members/{member}/shutdown", lead.token, {}).json_body["request"]["id"]
        for name, member in ids.items()
    }
    api.post(f"{path}/shutdown/{asks['ana']}", ana.token, {"approve": True})
    api.post(f"{path}/shutdown/{asks['ben']}", ben.token, {"approve": False, "reason": "writing the docs"})
    answers = {m["frame"]["from_name"]: m["frame"] for m in frames_in(api, lead, "shutdown_response")}
    assert answers["ana"]["approve"] is True
    assert answers["ben"]["approve"] is False and answers["ben"]["reason"] == "writing the docs"

    # A person sees all of it.
    seen = api.get(path, operator_token).json_body
    status = {m["name"]: m["session"]["liveness"] for m in seen["members"]}
    assert status == {"lead-story": "idle", "ana": "stopped", "ben": "idle"}
    board = api.get(f"{path}/tasks", operator_token).json_body["tasks"]
    assert [t["status"] for t in board] == ["completed", "completed"]
    assert api.get(f"{path}/requests", operator_token).json_body["requests"][0]["state"] in (
        "approved",
        "rejected",
    )
