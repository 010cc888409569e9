"""8 processes race to claim one task on PostgreSQL, 50 rounds: exactly one winner every round.

Each racer is its own OS process with its own connection (spawned, released together by a
barrier each round), against a fresh database. A naive read-then-write claim in the same harness
must produce double winners, which shows the processes really overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _race(database_url: str, home: Path, *extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "SWITCHBOARD_TEST_DB_NAME", "REDIS_URL")
    }
    env.update(SWITCHBOARD_HOME=str(home), SWITCHBOARD_JOBS="inline", SWITCHBOARD_LOG_LEVEL="WARNING")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hub_fixtures.claim_race",
            "--workers",
            "8",
            "--database-url",
            database_url,
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_eight_processes_one_task_exactly_one_winner_fifty_rounds(fresh_database, tmp_path):
    result = _race(fresh_database(), tmp_path, "--processes", "--rounds", "50")
    assert result["vendor"] == "postgresql"
    assert result["errors"] == []
    assert result["winners"] == [1] * 50


def test_the_process_harness_does_race_a_naive_claim_gets_double_winners(fresh_database, tmp_path):
    result = _race(fresh_database(), tmp_path, "--processes", "--rounds", "10", "--naive")
    assert result["errors"] == []
    assert max(result["winners"]) > 1


def test_eight_connections_draining_the_board_with_claim_next_never_share_a_task(fresh_database, tmp_path):
    result = _race(fresh_database(), tmp_path, "--rounds", "60", "--next")
    assert result["vendor"] == "postgresql"
    assert result["errors"] == []
    assert result["claimed"] == result["distinct"] == 60
