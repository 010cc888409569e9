"""What the agent side costs to start: `switchboard hook` wall time per call against a real hub, and
`switchboard mcp` time from spawn to its answer to `initialize` (what an MCP client waits for before
the agent can use the tools), each as a fresh process the way the agent client runs them; and the
CPU time (user + system) each of those processes used, which a busy machine inflates far less than
the wall time.

    .venv/bin/python bench/agent_start.py [--rounds 20] [--variant LABEL PYTHON DIR MODULE ...]

Each `--variant` runs `PYTHON -m MODULE` in DIR: a checkout of an earlier commit with this venv
(`.venv/bin/python /tmp/old console.cli`), or a venv where the package is installed, run from an
empty folder. This tree with this venv (`switchboard_agent.cli`) is always measured, as `now`. The variants take turns call by call, so a machine whose load changes during
the run weighs on each alike. Writes bench/results/agent_start-<UTC time>.json and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, progress, summary_ms, write_result

from hub_topology.embedded import start_hub

SESSION_ID = "b3e1c0de-0000-4000-8000-000000000002"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    },
}


def event(name: str, **fields: Any) -> str:
    return json.dumps(
        {"session_id": SESSION_ID, "cwd": "/work/bench", "hook_event_name": name, "transcript_path": ""}
        | fields
    )


def children_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's finished children."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def hook(command: list[str], env: dict[str, str], src: Path, payload: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `switchboard hook` process."""
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run(
        [*command, "hook"], input=payload, capture_output=True, text=True, env=env, cwd=src, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - started, children_cpu() - cpu


def mcp_start(command: list[str], env: dict[str, str], src: Path) -> tuple[float, float]:
    """Seconds from spawning `switchboard mcp` to its `initialize` answer on stdout, and the CPU
    seconds the server process used in all (it is stopped right after that answer)."""
    cpu, started = children_cpu(), time.perf_counter()
    server = subprocess.Popen(
        [*command, "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=src,
    )
    try:
        assert server.stdin and server.stdout
        server.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], 30)
        assert ready, "no answer to initialize in 30 s"
        answer = json.loads(server.stdout.readline())
        assert answer.get("id") == 1 and "result" in answer, answer
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(10)
    return wall, children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20, help="calls per case (at most 100)")
    parser.add_argument(
        "--variant", nargs=4, action="append", default=[], metavar=("LABEL", "PYTHON", "DIR", "MODULE")
    )
    args = parser.parse_args()
    rounds = max(2, min(args.rounds, 100))
    variants = {"now": ([sys.executable, "-m", "switchboard_agent.cli"], REPO)}
    for label, python, src, module in args.variant:
        variants[label] = ([python, "-m", module], Path(src))  # -m: DIR first on sys.path
    results: dict[str, Any] = {
        "rounds": rounds,
        "variants": {k: f"{' '.join(command)} (in {src})" for k, (command, src) in variants.items()},
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        hub_home, agent_home = tmp / "hub", tmp / "agent"
        hub_home.mkdir(mode=0o700)
        agent_home.mkdir(mode=0o700)
        progress("starting switchboard serve")
        hub = start_hub(hub_home)
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_"))}
            env |= {"SWITCHBOARD_HOME": str(agent_home), "SWITCHBOARD_URL": hub.url}
            env["SWITCHBOARD_ENROLL_KEY"] = hub.enroll_key
            post = event("PostToolUse", tool_name="Bash", tool_input={"command": "make"})
            hooks: dict[str, list[tuple[float, float]]] = {label: [] for label in variants}
            starts: dict[str, list[tuple[float, float]]] = {label: [] for label in variants}
            for command, src in variants.values():
                hook(command, env, src, event("SessionStart", source="startup"))
            progress(f"{rounds} rounds: a PostToolUse hook call and an MCP server start per variant")
            for _ in range(rounds):
                for label, (command, src) in variants.items():
                    hooks[label].append(hook(command, env, src, post))
                    starts[label].append(mcp_start(command, env, src))
            for label in variants:
                results[label] = {
                    "hook PostToolUse, wall": summary_ms([wall for wall, _ in hooks[label]]),
                    "hook PostToolUse, CPU": summary_ms([cpu for _, cpu in hooks[label]]),
                    "mcp start to initialize, wall": summary_ms([wall for wall, _ in starts[label]]),
                    "mcp server process, CPU": summary_ms([cpu for _, cpu in starts[label]]),
                }
        finally:
            hub.stop()
    write_result("agent_start", results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
