"""How long a Claude Code hook call costs the agent: `switchboard hook` as a fresh process per event
against a real `switchboard serve` (embedded: SQLite, in-process jobs) on a free loopback port.

Reports, per event kind, the process wall time (Python start-up and imports included) and the time
inside the hook (its HTTP round trips included, from $SWITCHBOARD_HOME/agent.log).

    .venv/bin/python bench/hook_latency.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hub_topology.embedded import start_hub  # noqa: E402
from hub_topology.hook import run_hook  # noqa: E402


def hook(env: dict[str, str], payload: dict[str, object]) -> float:
    code, _, seconds = run_hook(env, payload)
    assert code == 0
    return seconds * 1000


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(ordered):6.1f} ms  p95 {p95:6.1f} ms  (n={len(ordered)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hub_home, agent_home = Path(tmp, "hub"), Path(tmp, "agent")
        hub_home.mkdir(mode=0o700)
        agent_home.mkdir(mode=0o700)
        hub = start_hub(hub_home)
        try:
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "SWITCHBOARD_URL": hub.url,
                "SWITCHBOARD_ENROLL_KEY": hub.enroll_key,
                "SWITCHBOARD_HOME": str(agent_home),
            }
            base = {"session_id": "bench-session", "cwd": "/work/bench", "transcript_path": "/tmp/t.jsonl"}
            hook(env, {**base, "hook_event_name": "SessionStart", "source": "startup"})
            peer = httpx.post(
                f"{hub.url}/api/v1/sessions",
                json={"name": "peer"},
                headers={"Authorization": f"Bearer {hub.enroll_key}"},
            ).json()
            walls: dict[str, list[float]] = {
                "PostToolUse, nothing waiting": [],
                "PostToolUse, one message": [],
            }
            for _ in range(args.rounds):
                walls["PostToolUse, nothing waiting"].append(
                    hook(
                        env, {**base, "hook_event_name": "PostToolUse", "tool_name": "Bash", "tool_input": {}}
                    )
                )
                httpx.post(
                    f"{hub.url}/api/v1/messages",
                    json={"to": "bench", "message": "x" * 200},
                    headers={"Authorization": f"Bearer {peer['token']}"},
                )
                walls["PostToolUse, one message"].append(
                    hook(
                        env, {**base, "hook_event_name": "PostToolUse", "tool_name": "Bash", "tool_input": {}}
                    )
                )
            log = (agent_home / "agent.log").read_text()
            inside = [
                float(ms) for ms in re.findall(r"hook PostToolUse: ok; 1 request\(s\), ([\d.]+) ms", log)
            ]
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import switchboard_agent.hooks"], cwd=REPO, check=True)
            imports = (time.perf_counter() - started) * 1000
        finally:
            hub.stop()
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for name, values in walls.items():
        print(f"hook process wall, {name:<30} {summary(values)}")
    print(f"inside the hook (1 HTTP round trip each)       {summary(inside)}")
    print(f"python start-up + imports alone               {imports:6.1f} ms")


if __name__ == "__main__":
    main()
