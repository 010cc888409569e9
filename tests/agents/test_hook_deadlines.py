"""Hooks never stall the agent: behind a hub that accepts connections and never answers, every
`switchboard hook` process (each event, Claude Code's real payloads) ends within its deadline, and
after one failure later hooks skip the hub for a while (the breaker) instead of each paying it."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hub_topology import REPO
from hub_topology.hung import HungHub
from switchboard_agent.client import HubClient, HubUnreachable
from switchboard_agent.config import SavedSession, session_load, session_save
from switchboard_agent.hooks import run_hook

SESSION_ID = "5e1f0c2a-1b2c-4d3e-8f4a-9b8c7d6e5f4a"
HOOK_DEADLINE = 3.0  # switchboard_agent.hooks.HOOK_DEADLINE (test_the_deadline_is_the_hooks checks)
# Inside the hook (its log line), the deadline and a little; the process as a whole adds Python's
# start-up, which on a loaded machine takes a second or more.
INSIDE, WITHIN = HOOK_DEADLINE + 0.5, HOOK_DEADLINE + 3.0
EVENTS: dict[str, dict[str, Any]] = {
    "SessionStart": {"source": "startup"},
    "UserPromptSubmit": {"prompt": "go on"},
    "PostToolUse": {"tool_name": "Bash", "tool_input": {"command": "make"}, "tool_use_id": "toolu_01"},
    "Stop": {"stop_hook_active": False, "last_assistant_message": "Done."},
    "SessionEnd": {"reason": "prompt_input_exit"},
}


def payload(name: str) -> str:
    return json.dumps(
        {
            "session_id": SESSION_ID,
            "transcript_path": f"/tmp/{SESSION_ID}.jsonl",
            "cwd": "/work/payments",
            "permission_mode": "default",
            "hook_event_name": name,
            **EVENTS[name],
        }
    )


@pytest.fixture
def hung() -> Iterator[HungHub]:
    with HungHub() as hub:
        yield hub


def hook_process(home: Path, url: str, name: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_CODE_"))}
    env |= {"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_ENROLL_KEY": "k" * 32, "SWITCHBOARD_URL": url}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "hook"],
        input=payload(name),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=30,
    )
    return time.perf_counter() - started, done


def save_session(home: Path, url: str) -> None:
    """A session the hooks registered earlier (so each event makes its own request)."""
    session_save(SavedSession(key=SESSION_ID, hub=url, token="t" * 40, id="i", name="payments", ref="abc123"))


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(EVENTS))
def test_each_hook_event_ends_within_its_deadline_behind_a_hung_hub(
    hung: HungHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    if name != "SessionStart":
        save_session(tmp_path, hung.url)

    seconds, done = hook_process(tmp_path, hung.url, name)

    assert done.returncode == 0 and done.stdout == ""  # fail open: nothing for the agent to read
    assert hung.accepted >= 1  # it did reach the listener, which never answered
    log = (tmp_path / "agent.log").read_text().splitlines()[-1]
    assert "unreachable" in log or "deadline" in log
    inside = float(re.search(r"([\d.]+) ms$", log)[1]) / 1000
    assert inside < INSIDE, f"{name} took {inside:.1f} s inside the hook"
    assert seconds < WITHIN, f"{name} took {seconds:.1f} s"


@pytest.mark.e2e
def test_after_a_failure_later_hooks_skip_the_hub_for_a_while(
    hung: HungHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard_agent.config import Breaker

    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    save_session(tmp_path, hung.url)

    first, _ = hook_process(tmp_path, hung.url, "PostToolUse")
    later = [hook_process(tmp_path, hung.url, "PostToolUse")[0] for _ in range(3)]

    assert first >= HOOK_DEADLINE - 0.5  # the first one paid the deadline
    assert max(later) < first  # the next ones did not wait for the hub (it saw no more of them)
    assert hung.accepted == 1
    breaker = Breaker(hung.url)
    assert stat.S_IMODE(breaker.path.stat().st_mode) == 0o600
    log = (tmp_path / "agent.log").read_text().splitlines()
    skipped = [line for line in log if "skipped: the hub failed recently" in line]
    assert len(skipped) == 3
    assert all(float(re.search(r"([\d.]+) ms$", line)[1]) < 100 for line in skipped)  # inside the hook

    # The pause over, the next hook tries the hub again; failing again doubles the pause.
    state = json.loads(breaker.path.read_text())
    breaker.path.write_text(json.dumps({**state, "until": time.time() - 1}))
    hook_process(tmp_path, hung.url, "Stop")
    assert hung.accepted == 2
    assert json.loads(breaker.path.read_text())["pause"] == state["pause"] * 2


def test_a_request_under_a_deadline_ends_by_it_whatever_timeout_it_asks_for(hung: HungHub) -> None:
    client = HubClient(hung.url, "t" * 40)
    client.deadline = time.monotonic() + 1.0
    started = time.monotonic()
    with pytest.raises(HubUnreachable):
        client.inbox(limit=20)  # asks for wait + 10 s
    assert time.monotonic() - started < 1.5
    with pytest.raises(HubUnreachable, match="deadline passed"):
        client.me()  # no time left: it does not even start
    client.close()


def test_a_hub_that_answers_again_closes_the_breaker(
    inprocess_hub: str, register, send, tmp_path: Path
) -> None:
    from switchboard_agent.config import Breaker

    alice = register("alice")
    out = io.StringIO()
    assert run_hook(io.StringIO(payload("SessionStart")), out) == 0
    send(alice, "payments", "Refunds API is live.")
    breaker = Breaker(inprocess_hub)
    breaker.trip()
    breaker.path.write_text(json.dumps({"until": time.time() - 1, "pause": 15}))  # the pause is over

    out = io.StringIO()
    assert run_hook(io.StringIO(payload("PostToolUse")), out) == 0

    assert "Refunds API is live." in json.loads(out.getvalue())["hookSpecificOutput"]["additionalContext"]
    assert not breaker.path.exists()


def test_a_hook_kept_waiting_by_the_session_lock_leaves_a_hub_that_answers_in_use(
    inprocess_hub: str, tmp_path: Path
) -> None:
    """Another process (the MCP server, another hook) holds the session's lock while it registers,
    past this hook's time, with a hub that answers: the hook ends within its deadline, and the
    wait is not counted as the hub's failure, so the next hooks go to the hub, not around it."""
    from switchboard_agent.config import Breaker, session_lock

    with session_lock(SESSION_ID):  # held elsewhere (flock: each open file is its own holder)
        started = time.monotonic()
        out = io.StringIO()
        assert run_hook(io.StringIO(payload("SessionStart")), out, guard=True, spent=1.0) == 0
        took = time.monotonic() - started

    assert out.getvalue() == ""  # fail open: nothing for the client to act on
    assert took < HOOK_DEADLINE - 1.0 + 0.3, f"the hook waited {took:.1f} s for the lock"
    log = (Path(os.environ["SWITCHBOARD_HOME"]) / "agent.log").read_text().splitlines()
    assert "lock" in log[-1] and "deadline" in log[-1], log[-1]
    assert Breaker(inprocess_hub).open_until() is None  # the hub did nothing wrong

    out = io.StringIO()
    assert run_hook(io.StringIO(payload("PostToolUse")), out) == 0  # the lock is free again
    log = (Path(os.environ["SWITCHBOARD_HOME"]) / "agent.log").read_text().splitlines()
    assert " INFO hook PostToolUse: ok;" in log[-1], log[-1]  # registered on the hub, not skipped
    assert session_load(SESSION_ID) is not None


def test_the_deadline_counts_the_hook_process_start_up(hung: HungHub, tmp_path: Path, monkeypatch) -> None:
    """Claude Code times a hook from its start: the second Python took to start is part of the 3 s."""
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    monkeypatch.setenv("SWITCHBOARD_URL", hung.url)
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "k" * 32)
    save_session(tmp_path, hung.url)

    started = time.monotonic()
    assert run_hook(io.StringIO(payload("PostToolUse")), io.StringIO(), spent=0.8) == 0

    assert time.monotonic() - started < HOOK_DEADLINE - 0.8 + 0.3
    assert hung.accepted == 1


def test_a_hook_process_knows_how_long_ago_it_started() -> None:
    from switchboard_agent.hooks import process_age

    code = (
        "import time; time.sleep(0.3); from switchboard_agent.hooks import process_age; print(process_age())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=30)
    assert 0.3 <= float(done.stdout) < 5.0
    assert process_age() >= 0.0


@pytest.mark.e2e
def test_a_hook_whose_stdin_is_never_closed_ends_within_its_deadline(tmp_path: Path) -> None:
    """A client that writes the event and keeps the pipe open (or writes nothing at all) must not
    hold its agent: reading the event is inside the deadline too, and the hook fails open."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_CODE_"))}
    env |= {"SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_URL": "http://127.0.0.1:9"}
    started = time.perf_counter()
    hook = subprocess.Popen(
        [sys.executable, "-m", "switchboard_agent.cli", "hook"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert hook.stdin is not None
        hook.stdin.write(payload("PostToolUse")[:40])  # part of the event, then nothing more
        hook.stdin.flush()
        hook.wait(timeout=WITHIN + 5)
    finally:
        if hook.poll() is None:
            hook.kill()
            hook.wait(timeout=10)
    seconds = time.perf_counter() - started
    assert hook.returncode == 0 and hook.stdout is not None and hook.stdout.read() == ""
    assert seconds < WITHIN, f"the hook took {seconds:.1f} s with its stdin open"
    assert "deadline" in (tmp_path / "agent.log").read_text().splitlines()[-1]
