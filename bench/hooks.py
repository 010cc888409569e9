"""What a hook call costs the agent when the hub is up, down, or hung: `switchboard hook` as a fresh
process per event (as Claude Code runs it), PostToolUse with a saved session, wall time including
Python start-up, p50 and p99 per case.

- up: a real `switchboard serve` (embedded: SQLite, in-process jobs) on a free loopback port;
- down: a loopback port nobody listens on (connection refused);
- hung: a real listener on 127.0.0.1 that accepts every connection and never answers.

Down and hung are measured twice: each call on its own (the breaker file removed before each, so
every call pays the hook's deadline), and calls in a row as an agent makes them (the first pays,
the breaker makes the next ones skip the hub).

    .venv/bin/python bench/hooks.py [--rounds 10]

Writes bench/results/hooks-<UTC time>.json and prints a Markdown table (bench/results/hooks.md
keeps the last one reported).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, progress, summary_ms, write_result

from hub_topology import free_port
from hub_topology.embedded import start_hub
from hub_topology.hung import HungHub
from switchboard_agent.hooks import HOOK_DEADLINE

SESSION_ID = "b3e1c0de-0000-4000-8000-000000000001"


def event(name: str, **fields: Any) -> str:
    return json.dumps(
        {
            "session_id": SESSION_ID,
            "transcript_path": f"/tmp/{SESSION_ID}.jsonl",
            "cwd": "/work/bench",
            "permission_mode": "default",
            "hook_event_name": name,
            **fields,
        }
    )


POST_TOOL_USE = event("PostToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="toolu_01")


def hook(env: dict[str, str], url: str, payload: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "hook", "--url", url],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - started


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nobody listens there


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_CODE_"))}
    return env | {"SWITCHBOARD_HOME": str(home), **extra}


def fake_session(home: Path, url: str) -> None:
    """A session the hooks saved earlier (so each PostToolUse makes its request)."""
    os.environ["SWITCHBOARD_HOME"] = str(home)
    from switchboard_agent.config import SavedSession, session_save

    session_save(SavedSession(key=SESSION_ID, hub=url, token="t" * 40, id="i", name="bench", ref="abc123"))


def breaker_files(home: Path) -> list[Path]:
    return list((home / "sessions").glob(".breaker-*.json"))


def failing_cases(name: str, url: str, rounds: int, tmp: Path) -> dict[str, Any]:
    home = tmp / f"agent-{name}"
    home.mkdir(mode=0o700)
    env = agent_env(home, SWITCHBOARD_ENROLL_KEY="k" * 32)
    fake_session(home, url)
    progress(f"{name}: {rounds} calls, each on its own (no breaker)")
    alone = []
    for _ in range(rounds):
        for path in breaker_files(home):
            path.unlink()
        alone.append(hook(env, url, POST_TOOL_USE))
    for path in breaker_files(home):
        path.unlink()
    progress(f"{name}: {rounds} calls in a row (the breaker on)")
    in_a_row = [hook(env, url, POST_TOOL_USE) for _ in range(rounds)]
    return {
        "each call on its own": summary_ms(alone),
        "calls in a row": summary_ms(in_a_row),
        "first call in a row_ms": round(in_a_row[0] * 1000, 1),
        "later calls in a row": summary_ms(in_a_row[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10, help="calls per case (at most 50)")
    args = parser.parse_args()
    rounds = max(2, min(args.rounds, 50))
    results: dict[str, Any] = {"rounds": rounds, "deadline_s": HOOK_DEADLINE}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        hub_home, agent_home = tmp / "hub", tmp / "agent-up"
        hub_home.mkdir(mode=0o700)
        agent_home.mkdir(mode=0o700)
        progress("up: starting switchboard serve")
        hub = start_hub(hub_home)
        try:
            env = agent_env(agent_home, SWITCHBOARD_ENROLL_KEY=hub.enroll_key)
            hook(env, hub.url, event("SessionStart", source="startup"))
            progress(f"up: {rounds} calls")
            results["up"] = {"calls": summary_ms([hook(env, hub.url, POST_TOOL_USE) for _ in range(rounds)])}
        finally:
            hub.stop()
        results["down"] = failing_cases("down", closed_port_url(), rounds, tmp)
        with HungHub() as hung:
            results["hung"] = failing_cases("hung", hung.url, rounds, tmp)
    write_result("hooks", results)
    print("\n" + markdown(results))


def markdown(results: dict[str, Any]) -> str:
    rows = [
        "| hub | calls | p50 | p99 | max |",
        "| --- | --- | ---: | ---: | ---: |",
    ]

    def row(hub: str, what: str, s: dict[str, float]) -> None:
        rows.append(
            f"| {hub} | {what} (n={s['n']}) | {s['p50_ms']:.0f} ms | {s['p99_ms']:.0f} ms | {s['max_ms']:.0f} ms |"
        )

    row("up", "PostToolUse, nothing waiting", results["up"]["calls"])
    for hub in ("down", "hung"):
        found = results[hub]
        row(hub, "each call on its own", found["each call on its own"])
        row(hub, "later calls in a row (breaker)", found["later calls in a row"])
        rows.append(f"| {hub} | first call in a row | {found['first call in a row_ms']:.0f} ms | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
