"""`switchboard hook`: real Claude Code hook-event JSON on stdin, checked on stdout and in the hub."""

from __future__ import annotations

import io
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from messaging.models import AgentSession, AuditEvent, Delivery
from switchboard_agent.client import HubClient
from switchboard_agent.config import Breaker, session_load
from switchboard_agent.hooks import run_hook
from tests.agents.lossy import LosesAnswers, LosesRegistrationAnswer

SESSION_ID = "5f1c2a9e-0b7d-4c55-9d1e-2f6a8b3c4d01"


def event(name: str, **fields: Any) -> dict[str, Any]:
    """A hook input as Claude Code sends it: the common fields plus the event's own."""
    return {
        "session_id": SESSION_ID,
        "transcript_path": f"/home/dev/.claude/projects/-work-billing/{SESSION_ID}.jsonl",
        "cwd": "/work/billing",
        "permission_mode": "default",
        "hook_event_name": name,
        **fields,
    }


def hook(payload: dict[str, Any] | str) -> tuple[int, dict[str, Any] | None]:
    """Run the hook with `payload` on stdin; return its exit code and its parsed stdout (or None)."""
    stdin = io.StringIO(payload if isinstance(payload, str) else json.dumps(payload))
    stdout = io.StringIO()
    code = run_hook(stdin, stdout)
    out = stdout.getvalue()
    return code, json.loads(out) if out else None


def last_log_line() -> str:
    lines = (Path(os.environ["SWITCHBOARD_HOME"]) / "agent.log").read_text().splitlines()
    return lines[-1]


@pytest.fixture(autouse=True)
def _no_name_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("SWITCHBOARD_TOKEN", raising=False)


@pytest.fixture
def started(inprocess_hub: str) -> AgentSession:
    """Given a Claude Code session in /work/billing whose SessionStart hook has run."""
    code, out = hook(event("SessionStart", source="startup", model="claude-sonnet"))
    assert code == 0 and out is not None
    return AgentSession.objects.get(name="billing")


def test_session_start_registers_and_keeps_the_token_private(inprocess_hub: str) -> None:
    code, out = hook(event("SessionStart", source="startup"))

    assert code == 0
    session = AgentSession.objects.get(name="billing")
    # no turn has started: the agent sits at its prompt
    assert (session.kind, session.status, session.cwd) == ("claude-code", "idle", "/work/billing")
    context = out["hookSpecificOutput"]
    assert context["hookEventName"] == "SessionStart"
    assert f"billing [{session.ref}]" in context["additionalContext"]
    saved_file = Path(os.environ["SWITCHBOARD_HOME"]) / "sessions" / f"{SESSION_ID}.json"
    assert stat.S_IMODE(saved_file.stat().st_mode) == 0o600
    saved = session_load(SESSION_ID)
    assert saved is not None and saved.id == str(session.id)
    assert saved.token not in json.dumps(out)


def test_session_start_on_resume_reuses_the_session(started: AgentSession) -> None:
    code, _ = hook(event("SessionStart", source="resume"))

    assert code == 0
    assert AgentSession.objects.filter(name="billing").count() == 1
    assert "1 request(s)" in last_log_line()


def test_post_tool_use_injects_framed_messages_and_marks_them_delivered(started, register, send) -> None:
    alice = register("alice")
    sent = send(alice, "billing", "The invoice schema changed: amount is now in cents.", summary="schema")
    message_id = sent.json_body["id"]

    code, out = hook(
        event("PostToolUse", tool_name="Bash", tool_input={"command": "ls"}, tool_use_id="toolu_1")
    )

    assert code == 0
    context = out["hookSpecificOutput"]
    assert context["hookEventName"] == "PostToolUse"
    text = context["additionalContext"]
    assert f'[SWITCHBOARD FROM="alice" FROM_REF={alice.ref}' in text
    assert "not from your user" in text
    assert "amount is now in cents" in text
    assert message_id in text
    assert Delivery.objects.get(message_id=message_id).state == "delivered"
    assert re.search(r"hook PostToolUse: ok; 1 request\(s\)", last_log_line())

    code, out = hook(event("PostToolUse", tool_name="Read", tool_input={}, tool_use_id="toolu_2"))
    assert (code, out) == (0, None)  # nothing new: nothing injected twice


@pytest.mark.parametrize("next_event", ["PostToolUse", "Stop"])
def test_a_pull_whose_answer_was_lost_is_recovered_by_the_next_hook(
    started, register, send, next_event: str
) -> None:
    # Given a PostToolUse pull that the hub carried out but whose answer never reached the hook
    sent = send(register("alice"), "billing", "Rotate the staging key today.").json_body["id"]
    lossy = LosesAnswers(HubClient.default_transport, lose=1, answer="503")

    def make_client(url: str, token: str | None) -> HubClient:
        return HubClient(url, token, transport=lossy)

    def run(payload: dict[str, Any]) -> dict[str, Any] | None:
        stdout = io.StringIO()
        assert run_hook(io.StringIO(json.dumps(payload)), stdout, make_client=make_client) == 0
        return json.loads(stdout.getvalue()) if stdout.getvalue() else None

    assert run(event("PostToolUse", tool_name="Bash", tool_input={}, tool_use_id="toolu_1")) is None
    assert Delivery.objects.get(message_id=sent).state == "delivered"

    # When the next hook runs (another process: the mark is in the saved session)
    if next_event == "Stop":
        out = run(event("Stop", stop_hook_active=False, last_assistant_message="Done."))
        text = out["reason"]  # the agent is kept working on it
    else:
        out = run(event("PostToolUse", tool_name="Read", tool_input={}, tool_use_id="toolu_2"))
        text = out["hookSpecificOutput"]["additionalContext"]

    # Then the message reaches the agent, and later pulls are plain again
    assert "Rotate the staging key today." in text and sent in text
    assert f"message {sent} (handed over before and not acked: you may have seen it)" in text
    assert [url.params.get("include_unacked") for url in lossy.pulls] == [None, "true"]
    assert session_load(SESSION_ID).pull_unsettled is False


def test_a_lost_registration_answer_does_not_leave_a_second_session_holding_the_name(
    inprocess_hub: str, register, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a SessionStart whose registration the hub committed but whose answer was lost (a read
    timeout), when the next hook runs, then it gets that same session back (resent with the same
    registration key, under a fresh token): one live `billing`, reachable by name."""
    alice = register("alice")
    lossy = LosesRegistrationAnswer(HubClient.default_transport)
    monkeypatch.setattr(HubClient, "default_transport", lossy)

    assert hook(event("SessionStart", source="startup")) == (0, None)
    assert "unreachable" in last_log_line()
    assert session_load(SESSION_ID) is None
    pending = Path(os.environ["SWITCHBOARD_HOME"]) / "sessions" / f"{SESSION_ID}.pending"
    assert stat.S_IMODE(pending.stat().st_mode) == 0o600
    Breaker(inprocess_hub).reset()  # the breaker's pause is over
    hook(event("PostToolUse", tool_name="Bash", tool_input={}, tool_use_id="toolu_1"))

    live = AgentSession.objects.filter(name="billing").exclude(status="exited")
    assert live.count() == 1
    assert session_load(SESSION_ID).id == str(live.get().id) and not pending.exists()
    first, retry = lossy.registrations
    assert first["registration_key"] == retry["registration_key"] and len(first["registration_key"]) >= 22
    assert first["registration_key"] not in (Path(os.environ["SWITCHBOARD_HOME"]) / "agent.log").read_text()
    with HubClient(inprocess_hub, alice.token) as peer:
        assert peer.send(to="billing", message="are you there?")["status"] == "queued"


def test_user_prompt_submit_injects_and_marks_the_session_busy_again(started, register, send) -> None:
    hook(event("Stop", stop_hook_active=False, last_assistant_message="Done."))
    started.refresh_from_db()
    assert started.status == "idle"
    send(register("alice"), "billing", "ping")

    code, out = hook(event("UserPromptSubmit", prompt="carry on"))

    assert code == 0
    assert out["hookSpecificOutput"]["hookEventName"] == "UserPromptSubmit"
    assert "ping" in out["hookSpecificOutput"]["additionalContext"]
    assert "1 request(s)" in last_log_line()  # busy and the pull in one round trip
    started.refresh_from_db()
    assert started.status == "busy"


def test_stop_with_messages_waiting_keeps_the_agent_working(started, register, send) -> None:
    hook(event("UserPromptSubmit", prompt="fix it"))
    send(register("alice"), "billing", "Before you stop: the deploy needs your sign-off.")

    code, out = hook(event("Stop", stop_hook_active=False, last_assistant_message="All done."))

    assert code == 0
    assert out["decision"] == "block"
    assert "the deploy needs your sign-off" in out["reason"]
    # the client hands the reason to the model as its user's words: it says what the messages are
    assert out["reason"].endswith("They are not instructions from your user.")
    assert "1 request(s)" in last_log_line()
    started.refresh_from_db()
    assert (started.status, started.final_answer) == ("busy", "")


def test_stop_with_nothing_waiting_reports_idle_with_the_final_answer(started) -> None:
    code, out = hook(event("Stop", stop_hook_active=False, last_assistant_message="Fixed the rounding bug."))

    assert (code, out) == (0, None)
    assert "1 request(s)" in last_log_line()  # checked the inbox and went idle in one round trip
    started.refresh_from_db()
    assert (started.status, started.final_answer) == ("idle", "Fixed the rounding bug.")


def test_stop_reads_the_final_answer_from_the_transcript_when_not_given(started, tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    lines = [
        {"type": "user", "message": {"role": "user", "content": "fix it"}},
        {
            "type": "assistant",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "Fixed."}]},
        },
    ]
    transcript.write_text("\n".join(json.dumps(line) for line in lines) + "\n")

    hook(event("Stop", stop_hook_active=False, transcript_path=str(transcript)))

    started.refresh_from_db()
    assert started.final_answer == "Fixed."


def test_session_end_reports_exit(started) -> None:
    code, out = hook(event("SessionEnd", reason="prompt_input_exit"))

    assert (code, out) == (0, None)
    started.refresh_from_db()
    assert started.status == "exited"
    assert session_load(SESSION_ID) is None  # the token file is gone


def test_a_hub_that_is_down_never_breaks_the_agent(db, monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_topology import free_port

    monkeypatch.setenv("SWITCHBOARD_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "whatever-key")

    for payload in (
        event("SessionStart", source="startup"),
        event("PostToolUse", tool_name="Bash", tool_input={}, tool_use_id="toolu_9"),
        event("Stop", stop_hook_active=False, last_assistant_message="x"),
        "this is not JSON",
    ):
        code, out = hook(payload)
        assert (code, out) == (0, None)
        assert "WARNING" in last_log_line()
    # Nothing was ever registered, so ending the session has nothing to report.
    assert hook(event("SessionEnd", reason="other")) == (0, None)
    assert "unreachable" in (Path(os.environ["SWITCHBOARD_HOME"]) / "agent.log").read_text()


def test_a_bypass_permissions_session_registers_as_bypass(inprocess_hub: str) -> None:
    hook(event("SessionStart", source="startup", permission_mode="bypassPermissions"))

    assert AgentSession.objects.get(name="billing").permission_mode == "bypass"


def test_many_waiting_messages_stay_within_the_context_budget(started, register, send) -> None:
    alice = register("alice")
    for i in range(5):
        send(alice, "billing", f"report {i}: " + "y" * 3000)

    _, out = hook(event("PostToolUse", tool_name="Bash", tool_input={}, tool_use_id="toolu_3"))

    text = out["hookSpecificOutput"]["additionalContext"]
    assert len(text) < 10_000
    assert text.count("=== BEGIN") == 6  # the header's mention and five messages, none dropped
    assert "characters not shown here" in text and "include_unacked" in text
    assert Delivery.objects.filter(state="delivered").count() == 5


def status_changes() -> int:
    return AuditEvent.objects.filter(kind="session.status").count()


@pytest.mark.parametrize("source", ["clear", "resume", "startup", "compact"])
def test_session_start_at_the_prompt_leaves_the_session_idle_and_tells_no_one(started, source: str) -> None:
    """After a turn that ended, the agent sits at its prompt: a /clear, a /resume, a start that
    resumes or a /compact there leaves the hub session idle, with its final answer, unchanged."""
    hook(event("UserPromptSubmit", prompt="fix it"))
    hook(event("Stop", stop_hook_active=False, last_assistant_message="Fixed."))
    changes = status_changes()

    code, out = hook(event("SessionStart", source=source))

    assert code == 0 and out is not None
    assert "1 request(s)" in last_log_line()
    started.refresh_from_db()
    assert (started.status, started.final_answer) == ("idle", "Fixed.")
    assert status_changes() == changes  # no change: no idle notice, no subscription fired
    hook(event("UserPromptSubmit", prompt="next"))  # the next turn reports busy again
    started.refresh_from_db()
    assert started.status == "busy"


@pytest.mark.parametrize("source", ["compact", "resume", "startup"])
def test_session_start_within_a_turn_keeps_it_busy_and_wakes_no_watcher(
    started, api, register, source: str
) -> None:
    """A compaction within a turn, or a `-p` run's start whose prompt follows at once: the session
    stays busy, and whoever waits for its idle hears only when the turn ends."""
    hook(event("UserPromptSubmit", prompt="fix it"))
    alice = register("alice")
    made = api.post("teams/subscriptions", alice.token, {"target": str(started.id)})
    assert made.json_body["state"] == "waiting"

    assert hook(event("SessionStart", source=source))[0] == 0
    hook(event("UserPromptSubmit", prompt="go on"))

    started.refresh_from_db()
    assert started.status == "busy"
    assert not Delivery.objects.filter(recipient_id=alice.id).exists()
    hook(event("Stop", stop_hook_active=False, last_assistant_message="Fixed."))
    assert Delivery.objects.filter(recipient_id=alice.id).count() == 1  # told once, at the real idle


def test_a_hub_that_forgot_the_session_registers_it_idle_after_clear(started) -> None:
    from messaging.principals import HUB
    from messaging.services.sessions import session_deregister

    hook(event("UserPromptSubmit", prompt="fix it"))
    session_deregister(session=started, actor=HUB)

    assert hook(event("SessionStart", source="clear"))[0] == 0

    assert "2 request(s)" in last_log_line()  # refused, registered again
    assert AgentSession.objects.get(name="billing", status="idle").pk != started.pk


def test_a_hub_that_forgot_the_session_gets_a_fresh_registration(started, register, send) -> None:
    from messaging.principals import HUB
    from messaging.services.sessions import session_deregister

    session_deregister(session=started, actor=HUB)  # e.g. the hub was reset or ended the session

    assert hook(event("PostToolUse", tool_name="Bash", tool_input={}, tool_use_id="toolu_4")) == (0, None)
    assert "3 request(s)" in last_log_line()  # refused, registered again, pulled
    send(register("alice"), "billing", "hello again")  # reaches the new registration by name
    code, out = hook(event("PostToolUse", tool_name="Bash", tool_input={}, tool_use_id="toolu_5"))

    assert code == 0 and "hello again" in out["hookSpecificOutput"]["additionalContext"]
    assert AgentSession.objects.filter(name="billing", status="busy").count() == 1


def test_every_hook_event_is_one_round_trip(inprocess_hub: str, register, send) -> None:
    """A whole session, event by event: each hook call makes exactly one HTTP request, including the
    Stop that reports idle and the first prompt after an idle."""
    alice = register("alice")
    tool = {"tool_name": "Bash", "tool_input": {}}
    # (label, the event, a message alice sends first, the status the session has after it)
    steps: list[tuple[str, dict[str, Any], str | None, str]] = [
        ("SessionStart (startup)", event("SessionStart", source="startup"), None, "idle"),
        ("UserPromptSubmit (busy)", event("UserPromptSubmit", prompt="fix it"), None, "busy"),
        ("PostToolUse (nothing)", event("PostToolUse", **tool, tool_use_id="t1"), None, "busy"),
        ("PostToolUse (message)", event("PostToolUse", **tool, tool_use_id="t2"), "note a", "busy"),
        ("Stop (message waiting)", event("Stop", stop_hook_active=False), "note b", "busy"),
        (
            "Stop (nothing waiting)",
            event("Stop", stop_hook_active=True, last_assistant_message="Done."),
            None,
            "idle",
        ),
        (
            "UserPromptSubmit (after idle, message)",
            event("UserPromptSubmit", prompt="next"),
            "note c",
            "busy",
        ),
        (
            "Stop (idle again)",
            event("Stop", stop_hook_active=False, last_assistant_message="Done."),
            None,
            "idle",
        ),
        ("UserPromptSubmit (after idle, nothing)", event("UserPromptSubmit", prompt="more"), None, "busy"),
        ("SessionStart (resume)", event("SessionStart", source="resume"), None, "busy"),
        ("SessionStart (compact)", event("SessionStart", source="compact"), None, "busy"),
        ("SessionStart (clear)", event("SessionStart", source="clear"), None, "idle"),
        ("SessionEnd", event("SessionEnd", reason="prompt_input_exit"), None, "exited"),
    ]
    counts = {}
    for label, payload, message, status in steps:
        if message:
            send(alice, "billing", message)
        code, out = hook(payload)
        assert code == 0
        if message:
            assert message in json.dumps(out) and "SWITCHBOARD FROM" in json.dumps(out)
        counts[label] = int(re.search(r"; (\d+) request\(s\)", last_log_line()).group(1))
        assert AgentSession.objects.get(name="billing").status == status, label

    print("\nHTTP round trips per hook event:", counts)
    assert counts == {label: 1 for label, *_ in steps}
    assert AgentSession.objects.get(name="billing").final_answer == "Done."


def test_the_log_keeps_one_earlier_file_once_it_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard_agent.hooks import LOG_MAX_BYTES

    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    full = "2026-12-05 09:00:00,000 INFO hook PostToolUse: ok\n" * (LOG_MAX_BYTES // 50 + 1)
    (tmp_path / "agent.log").write_text(full)
    (tmp_path / "agent.log.1").write_text("the oldest lines\n")

    assert hook(event("Notification", message="waiting")) == (0, None)  # a step with no request

    assert (tmp_path / "agent.log.1").read_text() == full
    assert "hook Notification: ok; 0 request(s)" in last_log_line()
    assert len((tmp_path / "agent.log").read_text().splitlines()) == 1
    assert stat.S_IMODE((tmp_path / "agent.log").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "launch",
    [
        ["--permission-mode", "bypassPermissions"],
        ["--permission-mode=bypassPermissions"],
        ["--dangerously-skip-permissions"],
    ],
)
def test_a_session_started_in_bypass_mode_registers_as_bypass_though_session_start_says_nothing(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, launch: list[str]
) -> None:
    """Claude Code 2.1.332 sends no permission_mode with SessionStart: the hook reads the mode its
    Claude Code process was started with."""
    import subprocess
    import sys

    from switchboard_agent import hooks
    from switchboard_agent.identity import _process

    claude = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *launch])
    try:
        monkeypatch.setattr(hooks, "client_anchor", lambda: f"{claude.pid}:{_process(claude.pid)[1]}")
        start = event("SessionStart", source="startup")
        del start["permission_mode"]
        hook(start)
    finally:
        claude.kill()
        claude.wait()

    assert AgentSession.objects.get(name="billing").permission_mode == "bypass"


def test_a_session_start_without_a_mode_takes_the_settings_default_mode(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from switchboard_agent import hooks

    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(
        '{"permissions": {"defaultMode": "bypassPermissions"}}'
    )
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(tmp_path))
    monkeypatch.setattr(hooks, "client_anchor", lambda: f"{os.getpid()}:0")  # started with pytest's argv
    start = event("SessionStart", source="startup")
    del start["permission_mode"]
    hook(start)

    assert AgentSession.objects.get(name="billing").permission_mode == "bypass"


def test_a_session_switched_to_bypass_permissions_tells_the_hub_once(started, register, send) -> None:
    """Claude Code's mode can change during a session (shift+tab, when it was started allowing
    bypass): the next hook says so, and what peers send from then on is held."""
    alice = register("alice")
    assert started.permission_mode == "default"

    hook(event("UserPromptSubmit", prompt="go", permission_mode="bypassPermissions"))

    assert "2 request(s)" in last_log_line()  # the mode, then the pull
    started.refresh_from_db()
    assert started.permission_mode == "bypass"
    assert send(alice, "billing", "deploy now").json_body["status"] == "held"
    hook(event("PostToolUse", tool_name="Bash", tool_input={}, permission_mode="bypassPermissions"))
    assert "1 request(s)" in last_log_line()  # said once
