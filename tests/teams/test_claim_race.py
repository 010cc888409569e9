"""8 threads race to claim one task, 50 rounds, on a real SQLite file: exactly one winner each time.

The race runs in a child process with its own file-backed SQLite database (the hub's embedded
footprint: WAL, BEGIN IMMEDIATE), because pytest-django's in-memory SQLite is a shared cache where
writers fail with "table is locked" instead of queueing. A naive read-then-write claim in the same
harness must produce double winners, which shows the threads really overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _race(tmp_path: Path, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SWITCHBOARD_TEST_DB_NAME")}
    env["SWITCHBOARD_HOME"] = str(tmp_path)
    env["SWITCHBOARD_JOBS"] = "inline"
    env["SWITCHBOARD_LOG_LEVEL"] = "WARNING"
    done = subprocess.run(
        [sys.executable, "-m", "hub_fixtures.claim_race", "--workers", "8", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_eight_threads_one_task_exactly_one_winner_fifty_rounds(tmp_path):
    result = _race(tmp_path, "--rounds", "50")
    assert result["database"].endswith(".sqlite3")
    assert result["errors"] == []
    assert result["winners"] == [1] * 50


def test_the_harness_does_race_a_naive_claim_gets_double_winners(tmp_path):
    result = _race(tmp_path, "--rounds", "10", "--naive")
    assert result["errors"] == []
    assert max(result["winners"]) > 1


def test_eight_threads_draining_the_board_with_claim_next_never_share_a_task(tmp_path):
    result = _race(tmp_path, "--rounds", "60", "--next")
    assert result["errors"] == []
    assert result["claimed"] == result["distinct"] == 60
