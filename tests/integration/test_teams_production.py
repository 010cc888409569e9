"""Teams on the production topology: quality-gate calls made by the Celery worker, retries by beat.

The lead and the teammate talk to different web processes; the hook is a real HTTP server on
127.0.0.1. Waits are bounded polls on the API (no fixed sleeps asserted as timings).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.harness import free_port
from tests.teams.hooks import Hook

pytestmark = pytest.mark.integration


@pytest.fixture
def hook() -> Iterator[Hook]:
    server = Hook().start()
    yield server
    server.stop()


def _until(check: Callable[[], Any], seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not reached within {seconds} s")


def _crew(hub: Any, tag: str) -> tuple[Any, Any, str, str]:
    lead = hub.register(f"lead-{tag}", web=0)
    mate = hub.register(f"mate-{tag}", web=1)
    with hub.client(0, headers=lead.headers) as c:
        team = c.post("/api/v1/teams", json={"name": tag}).json()
        invited = c.post(f"/api/v1/teams/{team['id']}/members", json={"session": mate.id}).json()
    # A lead invites; the session joins when it accepts.
    with hub.client(1, headers=mate.headers) as c:
        member = c.post(f"/api/v1/teams/invitations/{invited['invitation']['id']}/accept").json()
    return lead, mate, team["id"], member["member_id"]


def _claimed(hub: Any, lead: Any, mate: Any, team_id: str) -> int:
    with hub.client(0, headers=lead.headers) as c:
        task = c.post(f"/api/v1/teams/{team_id}/tasks", json={"title": "ship"}).json()
    with hub.client(1, headers=mate.headers) as c:
        assert c.post(f"/api/v1/tasks/{task['id']}/claim", json={}).status_code == 200
    return task["id"]


def _task(hub: Any, who: Any, task_id: int) -> dict[str, Any]:
    with hub.client(0, headers=who.headers) as c:
        return c.get(f"/api/v1/tasks/{task_id}").json()


def test_the_worker_calls_the_gate_and_a_rejection_reaches_the_teammate(hub, hook):
    lead, mate, team_id, _ = _crew(hub, "gate-reject")
    with hub.client(0, headers=lead.headers) as c:
        put = c.put(f"/api/v1/teams/{team_id}/gates/task_completed", json={"url": hook.url})
        assert put.status_code == 200, put.text
    task_id = _claimed(hub, lead, mate, team_id)
    hook.answer(409, {"reason": "changelog entry missing"})
    hook.answer(200)

    with hub.client(1, headers=mate.headers) as c:
        pending = c.post(f"/api/v1/tasks/{task_id}/complete", json={}).json()
    assert pending["gate_pending"] == "task_completed"  # the web process did not wait for the hook
    sent_back = _until(lambda: (t := _task(hub, lead, task_id))["gate_reason"] and t)
    assert sent_back["status"] == "in_progress" and sent_back["gate_reason"] == "changelog entry missing"

    def told() -> list[dict[str, Any]]:
        with hub.client(1, headers=mate.headers) as c:
            return [m for m in c.get("/api/v1/inbox").json()["messages"] if m["kind"] == "notification"]

    note = _until(told)
    assert "changelog entry missing" in note[0]["text"]

    with hub.client(1, headers=mate.headers) as c:
        c.post(f"/api/v1/tasks/{task_id}/complete", json={})
    assert _until(lambda: _task(hub, lead, task_id)["status"] == "completed")
    assert [r["event"] for r in hook.received] == ["task_completed", "task_completed"]


def test_a_hook_that_is_down_is_retried_by_beat_then_fails_open(hub):
    dead = f"http://127.0.0.1:{free_port()}/gate"
    lead, mate, team_id, _ = _crew(hub, "gate-down")
    with hub.client(0, headers=lead.headers) as c:
        body = {"url": dead, "max_attempts": 2, "timeout_seconds": 1}
        assert c.put(f"/api/v1/teams/{team_id}/gates/task_completed", json=body).status_code == 200
    task_id = _claimed(hub, lead, mate, team_id)
    with hub.client(1, headers=mate.headers) as c:
        c.post(f"/api/v1/tasks/{task_id}/complete", json={})
    assert _until(lambda: _task(hub, lead, task_id)["status"] == "completed", seconds=60)
    rows = hub.sql("SELECT state, attempts FROM teams_gatecheck WHERE task_id = %s", task_id)
    assert rows == [("failed", 2)]


def test_an_idle_teammate_reaches_its_lead_through_another_web_process(hub):
    lead, mate, team_id, member_id = _crew(hub, "idle")
    with hub.client(1, headers=mate.headers) as c:
        c.patch("/api/v1/sessions/me", json={"status": "busy"})
        c.patch("/api/v1/sessions/me", json={"status": "idle", "final_answer": "all tests pass"})
    with hub.client(0, headers=lead.headers) as c:
        messages = c.get("/api/v1/inbox").json()["messages"]
    [note] = [m for m in messages if m["frame_type"] == "idle_notification"]
    frame = json.loads(note["text"])
    assert frame["final_answer"] == "all tests pass" and frame["from_member"] == member_id
