"""`switchboard hook` as Claude Code runs it: a fresh process per event, the event's JSON on stdin."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from hub_topology import REPO


def run_hook(env: dict[str, str], payload: dict[str, Any]) -> tuple[int, dict[str, Any] | None, float]:
    """Run one hook process with `env` as its whole environment: its exit code, the JSON it printed
    (None for nothing) and its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "hook"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=30,
    )
    elapsed = time.perf_counter() - started
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, elapsed
