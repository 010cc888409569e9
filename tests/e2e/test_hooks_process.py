"""`switchboard hook` as Claude Code runs it: a fresh process per event, the event's JSON on stdin,
against a real `switchboard serve` process; then the same with the hub stopped."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from hub_topology.embedded import Hub
from hub_topology.hook import run_hook

pytestmark = pytest.mark.e2e
SESSION_ID = "0d9a7c2e-4f61-4b8a-9c3e-5a1b2c3d4e5f"


def event(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "session_id": SESSION_ID,
        "transcript_path": f"/tmp/{SESSION_ID}.jsonl",
        "cwd": "/work/payments",
        "permission_mode": "default",
        "hook_event_name": name,
        **fields,
    }


def test_a_claude_code_session_lifecycle_through_hook_processes(hub: Hub, tmp_path: Path) -> None:
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    env = {
        "PATH": "/usr/bin:/bin",
        "SWITCHBOARD_URL": hub.url,
        "SWITCHBOARD_ENROLL_KEY": hub.enroll_key,
        "SWITCHBOARD_HOME": str(home),
    }
    api = httpx.Client(base_url=f"{hub.url}/api/v1")
    alice = api.post(
        "sessions", json={"name": "alice"}, headers={"Authorization": f"Bearer {hub.enroll_key}"}
    )
    alice_auth = {"Authorization": f"Bearer {alice.json()['token']}"}
    timings: dict[str, float] = {}

    code, out, timings["SessionStart"] = run_hook(env, event("SessionStart", source="startup"))
    assert code == 0 and "payments [" in out["hookSpecificOutput"]["additionalContext"]

    sent = api.post(
        "messages", json={"to": "payments", "message": "Refunds API is live."}, headers=alice_auth
    )
    code, out, timings["PostToolUse"] = run_hook(
        env, event("PostToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="toolu_01")
    )
    assert code == 0 and "Refunds API is live." in out["hookSpecificOutput"]["additionalContext"]
    status = api.get(f"messages/{sent.json()['id']}", headers=alice_auth).json()
    assert status["status"] == "delivered"

    code, out, timings["PostToolUse (nothing new)"] = run_hook(
        env, event("PostToolUse", tool_name="Read", tool_input={}, tool_use_id="toolu_02")
    )
    assert (code, out) == (0, None)

    api.post("messages", json={"to": "payments", "message": "One more thing."}, headers=alice_auth)
    code, out, timings["Stop (messages waiting)"] = run_hook(
        env, event("Stop", stop_hook_active=False, last_assistant_message="Done.")
    )
    assert code == 0 and out["decision"] == "block" and "One more thing." in out["reason"]

    code, out, timings["Stop (idle)"] = run_hook(
        env, event("Stop", stop_hook_active=True, last_assistant_message="Shipped refunds.")
    )
    assert (code, out) == (0, None)
    agents = {a["name"]: a for a in api.get("agents", headers=alice_auth).json()["agents"]}
    assert agents["payments"]["status"] == "idle"

    api.post("messages", json={"to": "payments", "message": "Next: chargebacks."}, headers=alice_auth)
    code, out, timings["UserPromptSubmit (after idle)"] = run_hook(
        env, event("UserPromptSubmit", prompt="carry on")
    )
    assert code == 0 and "Next: chargebacks." in out["hookSpecificOutput"]["additionalContext"]
    agents = {a["name"]: a for a in api.get("agents", headers=alice_auth).json()["agents"]}
    assert agents["payments"]["status"] == "busy"

    code, out, timings["SessionEnd"] = run_hook(env, event("SessionEnd", reason="prompt_input_exit"))
    assert (code, out) == (0, None)
    everyone = api.get("agents", params={"include_exited": "true"}, headers=alice_auth).json()["agents"]
    assert {a["name"]: a["status"] for a in everyone}["payments"] == "exited"

    log = (home / "agent.log").read_text()
    inside = [float(ms) for ms in re.findall(r"request\(s\), ([\d.]+) ms", log)]
    print("\nhook process wall time (Python start-up included):")
    for name, seconds in timings.items():
        print(f"  {name:<30} {seconds * 1000:7.0f} ms")
    print(f"  time inside the hook (HTTP included): {', '.join(f'{ms:.1f}' for ms in inside)} ms")
    per_event = re.findall(r"hook (\w+): ok; (\d+) request", log)
    print("  HTTP round trips per hook call:", ", ".join(f"{name} {n}" for name, n in per_event))
    assert len(per_event) == len(timings) and {n for _, n in per_event} == {"1"}

    hub.stop()  # the hub goes down: the agent must not notice
    code, out, elapsed = run_hook(env, event("UserPromptSubmit", prompt="next task"))
    assert (code, out) == (0, None)
    assert elapsed < 10
    assert "unreachable" in (home / "agent.log").read_text().splitlines()[-1]
