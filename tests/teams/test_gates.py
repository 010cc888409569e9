"""Quality gates against a real HTTP hook on 127.0.0.1: accept, reject with a reason, hook down."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from hub_topology import free_port
from teams.models import GateCheck
from teams.services.gates import gate_checks_run_due
from tests.teams.conftest import frames_in
from tests.teams.hooks import Hook

pytestmark = pytest.mark.django_db(transaction=True)  # gate calls run after commit


@pytest.fixture(autouse=True)
def _loopback_allowed(settings) -> None:
    """The hooks here listen on 127.0.0.1, which the hub calls only when an operator allows it."""
    settings.SWITCHBOARD_OUTBOUND_ALLOW = ["127.0.0.1"]


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A live hook server on a free loopback port."""
    server = Hook()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def dead_url() -> str:
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}/gate"


def _gate(api, crew, event, url, **options):
    body = {"url": url, "timeout_seconds": options.pop("timeout_seconds", 2.0), **options}
    made = api.call("PUT", crew.path(f"/gates/{event}"), crew.lead.token, body)
    assert made.status_code == 200, made.json_body


def _claimed_task(api, crew, title="feature"):
    task = api.post(crew.path("/tasks"), crew.lead.token, {"title": title}).json_body
    assert api.post(f"tasks/{task['id']}/claim", crew.alice.token, {}).status_code == 200
    return task


def _task(api, crew, task):
    return api.get(f"tasks/{task['id']}", crew.lead.token).json_body


def test_task_completed_gate_accepts(api, crew, hook):
    _gate(api, crew, "task_completed", hook.url)
    task = _claimed_task(api, crew)
    hook.answer(200)
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {"result": "done"})
    assert _task(api, crew, task)["status"] == "completed"
    [call] = hook.received
    assert call["event"] == "task_completed" and call["task"]["id"] == task["id"]


def test_task_completed_gate_rejects_with_a_reason_that_reaches_the_teammate(api, crew, hook):
    _gate(api, crew, "task_completed", hook.url)
    task = _claimed_task(api, crew)
    hook.answer(409, {"reason": "coverage dropped below 80%"})
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    after = _task(api, crew, task)
    assert after["status"] == "in_progress" and after["owner"]["name"] == "alice"
    assert after["gate_pending"] is None and after["gate_reason"] == "coverage dropped below 80%"
    told = [m for m in frames_in(api, crew.alice) if m["kind"] == "notification"]
    assert len(told) == 1 and "coverage dropped below 80%" in told[0]["text"]
    assert told[0]["from"] is None  # the hub reports the gate's verdict; the lead did not say it
    # Fixed, completed again, accepted this time.
    hook.answer(200)
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    assert _task(api, crew, task)["status"] == "completed"


def test_a_pending_gate_blocks_a_second_completion_and_dependants(api, crew, dead_url):
    _gate(api, crew, "task_completed", dead_url, max_attempts=3)
    task = _claimed_task(api, crew)
    after = api.post(
        crew.path("/tasks"), crew.lead.token, {"title": "next", "blocked_by": [task["id"]]}
    ).json_body
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    assert _task(api, crew, task)["gate_pending"] == "task_completed"
    assert api.post(f"tasks/{task['id']}/complete", crew.alice.token, {}).status_code == 409
    assert api.post(f"tasks/{after['id']}/claim", crew.bob.token, {}).status_code == 409


def _run_retries(times: int) -> None:
    moment = timezone.now()
    for _ in range(times):
        moment += timedelta(minutes=10)
        gate_checks_run_due(now=moment)


def test_hook_down_is_retried_then_fails_open_by_default(api, crew, dead_url):
    _gate(api, crew, "task_completed", dead_url, max_attempts=3)
    task = _claimed_task(api, crew)
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    check = GateCheck.objects.get()
    assert check.state == "pending" and check.attempts == 1 and "ConnectError" in check.last_error
    _run_retries(2)
    check.refresh_from_db()
    assert check.state == "failed" and check.attempts == 3
    assert _task(api, crew, task)["status"] == "completed"


def test_hook_down_blocks_when_the_gate_fails_closed(api, crew, dead_url):
    _gate(api, crew, "task_completed", dead_url, max_attempts=2, fail_closed=True)
    task = _claimed_task(api, crew)
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    _run_retries(1)
    after = _task(api, crew, task)
    assert after["status"] == "in_progress" and "could not be reached" in after["gate_reason"]
    told = [m for m in frames_in(api, crew.alice) if m["kind"] == "notification"]
    assert "could not be reached" in told[0]["text"]


def test_a_server_error_is_retried_and_a_later_yes_counts(api, crew, hook):
    _gate(api, crew, "task_completed", hook.url, max_attempts=3)
    task = _claimed_task(api, crew)
    hook.answer(503)
    hook.answer(200)
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    assert _task(api, crew, task)["status"] == "in_progress"
    _run_retries(1)
    assert _task(api, crew, task)["status"] == "completed"
    assert len(hook.received) == 2


def test_a_hook_slower_than_its_timeout_counts_as_down(api, crew, hook):
    _gate(api, crew, "task_completed", hook.url, max_attempts=1, timeout_seconds=0.2)
    task = _claimed_task(api, crew)
    hook.answer(409, {"reason": "too late to matter"}, delay=1.0)
    api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    check = GateCheck.objects.get()
    assert check.state == "failed" and "Timeout" in check.last_error
    assert _task(api, crew, task)["status"] == "completed"


def test_task_created_gate_holds_a_task_until_accepted_or_rejects_it(api, crew, hook):
    _gate(api, crew, "task_created", hook.url)
    hook.answer(200)
    ok = api.post(crew.path("/tasks"), crew.alice.token, {"title": "fine"}).json_body
    assert _task(api, crew, ok)["gate_pending"] is None
    assert api.post(f"tasks/{ok['id']}/claim", crew.alice.token, {}).status_code == 200

    hook.answer(409, {"reason": "needs an acceptance criterion"})
    bad = api.post(crew.path("/tasks"), crew.alice.token, {"title": "vague"}).json_body
    after = _task(api, crew, bad)
    assert after["status"] == "rejected" and after["gate_reason"] == "needs an acceptance criterion"
    assert api.post(f"tasks/{bad['id']}/claim", crew.bob.token, {}).status_code == 409
    told = [m for m in frames_in(api, crew.alice) if m["kind"] == "notification"]
    assert "needs an acceptance criterion" in told[0]["text"]


def test_teammate_idle_gate_sends_the_teammate_back_or_lets_the_lead_know(api, crew, hook):
    _gate(api, crew, "teammate_idle", hook.url)
    hook.answer(409, {"reason": "the linter still fails"})
    api.patch("sessions/me", crew.alice.token, {"status": "busy"})
    api.patch("sessions/me", crew.alice.token, {"status": "idle", "final_answer": "done, I think"})
    assert frames_in(api, crew.lead, "idle_notification") == []
    told = [m for m in frames_in(api, crew.alice) if m["kind"] == "notification"]
    assert "the linter still fails" in told[0]["text"]
    assert hook.received[0]["final_answer"] == "done, I think"

    hook.answer(200)
    api.patch("sessions/me", crew.alice.token, {"status": "busy"})
    api.patch("sessions/me", crew.alice.token, {"status": "idle", "final_answer": "linter green"})
    [note] = frames_in(api, crew.lead, "idle_notification")
    assert note["frame"]["final_answer"] == "linter green"


def test_only_the_lead_sets_gates(api, crew, hook):
    made = api.call("PUT", crew.path("/gates/task_created"), crew.alice.token, {"url": hook.url})
    assert made.status_code == 403
    _gate(api, crew, "task_created", hook.url)
    removed = api.call("DELETE", crew.path("/gates/task_created"), crew.alice.token)
    assert (removed.status_code, removed.json_body["error"]) == (403, "forbidden")
