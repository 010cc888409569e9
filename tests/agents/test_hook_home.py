"""A hook under an unsafe `$SWITCHBOARD_HOME` fails open and says so where its user looks.

The failure: the home (or its sessions folder, or a file the agent side reads there) is one another
local user could write, so the hook refuses it (security.md, "The agent side on a shared
machine"). It used to say why only in one stderr line, which Claude Code, Codex and Gemini CLI do
not show: the agent went on silently unconnected. Now the SessionStart hook answers with a
`systemMessage` (each of the three clients shows it to the user) naming what is wrong and the
command that fixes it, once per session (no other event repeats it), still exiting 0 and without a
request to any hub; and `switchboard doctor` says the same.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hub_topology import REPO
from hub_topology.hung import HungHub
from switchboard_agent.hooks import EVENTS, UNSAFE_HOME_CONTEXT, UNSAFE_HOME_NOTICE, run_hook
from tests.agents.codex_payloads import codex_event

NOBODY = 65534
SESSION_ID = "5e1f0c2a-1b2c-4d3e-8f4a-9b8c7d6e5f4a"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
# Codex 0.171's session-start.command.output schema (additionalProperties: false).
CODEX_SESSION_START_KEYS = {"continue", "hookSpecificOutput", "stopReason", "suppressOutput", "systemMessage"}


def event(client: str, name: str, **fields: Any) -> dict[str, Any]:
    if client == "codex":
        return codex_event(name, **fields)
    return {"session_id": SESSION_ID, "cwd": "/work/payments", "hook_event_name": name, **fields}


@pytest.fixture
def hub() -> Iterator[HungHub]:
    """Where the hook would send its requests: it must not reach it at all."""
    with HungHub() as listener:
        yield listener


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: HungHub) -> Path:
    folder = tmp_path / "sb"
    (folder / "sessions").mkdir(parents=True, mode=0o700)
    folder.chmod(0o700)
    monkeypatch.setenv("SWITCHBOARD_HOME", str(folder))
    monkeypatch.setenv("SWITCHBOARD_URL", hub.url)
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "k" * 32)
    return folder


def hook(client: str, payload: dict[str, Any]) -> str:
    out = io.StringIO()
    assert run_hook(io.StringIO(json.dumps(payload)), out, client_name=client) == 0
    return out.getvalue()


def make_unsafe(home: Path, how: str) -> tuple[Path, str]:
    """Make `home` unsafe in the way `how` names; the path at fault and the fix the user is given."""
    if how == "home open to others":
        home.chmod(0o777)
        return home, f"chmod 0700 {home}"
    if how == "sessions folder open to others":
        (home / "sessions").chmod(0o777)
        return home / "sessions", f"chmod 0700 {home / 'sessions'}"
    if how == "session file others can write":
        planted = home / "sessions" / f"{SESSION_ID}.json"
        planted.write_text("{}")
        planted.chmod(0o666)
        return planted, f"chmod 0600 {planted}"
    if how == "sessions folder of another user":
        os.chown(home / "sessions", NOBODY, NOBODY)
        return home / "sessions", f"sudo chown -R {_me()} {home / 'sessions'} && chmod 0700"
    raise AssertionError(how)


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


UNSAFE = [
    "home open to others",
    "sessions folder open to others",
    "session file others can write",
    pytest.param("sessions folder of another user", marks=needs_root),
]


@pytest.mark.parametrize("how", UNSAFE)
@pytest.mark.parametrize("client", ["claude", "codex", "gemini"])
def test_the_session_start_hook_tells_the_user_what_is_wrong_and_the_fix(
    home: Path, hub: HungHub, client: str, how: str
) -> None:
    at_fault, fix = make_unsafe(home, how)

    answer = json.loads(hook(client, event(client, "SessionStart", source="startup")))

    shown = answer["systemMessage"]
    assert shown.startswith(UNSAFE_HOME_NOTICE)
    assert str(at_fault) in shown and fix in shown
    assert answer["hookSpecificOutput"] == {
        "hookEventName": "SessionStart",
        "additionalContext": UNSAFE_HOME_CONTEXT,  # the model: not connected, and not its to fix
    }
    assert fix not in UNSAFE_HOME_CONTEXT
    if client == "codex":
        assert set(answer) <= CODEX_SESSION_START_KEYS
    assert hub.accepted == 0  # nothing from the unsafe home was believed, no request was sent


@pytest.mark.parametrize("client", ["claude", "codex", "gemini"])
def test_only_the_session_start_says_it(home: Path, hub: HungHub, client: str) -> None:
    """Once per session: every later event fails open in silence, as before."""
    make_unsafe(home, "home open to others")
    for name in EVENTS[client]:
        if EVENTS[client][name] in ("start", "turn-complete"):
            continue
        assert hook(client, event(client, name, prompt="go on", tool_name="Bash", reason="exit")) == "", name
    if client == "claude":  # the same session going on after a compaction
        assert hook(client, event(client, "SessionStart", source="compact")) == ""
    assert hub.accepted == 0


def test_a_safe_home_gets_no_notice(home: Path, hub: HungHub) -> None:
    out = hook("claude", event("claude", "SessionStart", source="startup"))
    assert UNSAFE_HOME_NOTICE not in out  # (the hung hub: the hook fails open, printing nothing)
    assert hub.accepted == 1


@pytest.mark.parametrize("client", ["claude", "codex", "gemini"])
def test_the_hook_process_exits_0_with_the_notice_on_stdout(home: Path, client: str) -> None:
    """As the client runs it: `switchboard hook` (Gemini's line adds `|| true`), JSON on stdin."""
    make_unsafe(home, "home open to others")
    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "hook", "--client", client],
        input=json.dumps(event(client, "SessionStart", source="startup")),
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0
    assert f"chmod 0700 {home}" in json.loads(done.stdout)["systemMessage"]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "doctor", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize("how", UNSAFE)
def test_doctor_says_what_is_wrong_with_the_home_and_the_fix(home: Path, how: str) -> None:
    at_fault, fix = make_unsafe(home, how)

    done = doctor()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "NOT SAFE" in done.stdout
    assert str(at_fault) in done.stdout and fix in done.stdout

    report = json.loads(doctor("--json").stdout)
    assert report["home_ok"] is False
    assert [p["path"] for p in report["home_problems"]] == [str(at_fault)]
    assert fix in report["home_problems"][0]["fix"]


def test_doctor_on_a_safe_home_names_the_hub_and_whether_it_answers(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9")
    done = doctor()
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"home: {home}: ok" in done.stdout
    assert "hub: http://127.0.0.1:9: NOT REACHED" in done.stdout
