"""The `switchboard` command as a shell runs it: a real process against a hub served over HTTP
(pytest-django's live server), for what only a real process shows: `eval`, a pipe closed early, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from messaging.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)  # the live server's thread shares the database
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shell_env(live_server: Any, settings: Any) -> dict[str, str]:
    """The environment a user's shell would have: the hub's URL and enrollment key, no session."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env.update(
        SWITCHBOARD_URL=live_server.url,
        SWITCHBOARD_ENROLL_KEY=settings.SWITCHBOARD_ENROLL_KEY,
        SWITCHBOARD_HOME=os.environ["SWITCHBOARD_HOME"],
        PYTHONPATH=str(REPO),
    )
    return env


SWITCHBOARD = f"{sys.executable} -m switchboard_agent.cli"


def test_eval_of_register_exports_the_token_and_runs_nothing_else(shell_env: dict[str, str]) -> None:
    script = f'eval "$({SWITCHBOARD} register --name ci)" && printf %s "$SWITCHBOARD_TOKEN"'

    done = subprocess.run(["bash", "-c", script], env=shell_env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sbs_")
    assert "Registered ci [" in done.stderr  # the note is on stderr, for the person
    assert "command not found" not in done.stderr  # ... so eval never ran it as a command


def test_a_pipe_closed_early_prints_no_traceback_and_acks_nothing_unseen(
    shell_env: dict[str, str], register, send
) -> None:
    bob = register("bob")
    alice = register("alice")
    # More than a pipe's buffer (64 KiB), so writing runs into the closed pipe for certain.
    sent = [send(alice, "bob", f"part {i}\n" + "x" * 40_000).json_body["id"] for i in range(3)]
    shell_env["SWITCHBOARD_TOKEN"] = bob.token

    reader = subprocess.Popen(
        [sys.executable, "-m", "switchboard_agent.cli", "inbox", "--ack"],
        env=shell_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    first = reader.stdout.readline()  # what `| head -1` does: one line, then close
    reader.stdout.close()
    err = reader.stderr.read().decode()
    code = reader.wait(timeout=60)

    assert first.startswith(b"Switchboard: 3 messages")
    assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err
    assert "3 message(s) stay unacked: `switchboard inbox --unacked` shows them again." in err
    states = {str(d.message_id): d.state for d in Delivery.objects.filter(message_id__in=sent)}
    assert set(states.values()) == {"delivered"}  # handed over, not acked: nothing lost

    again = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "inbox", "--unacked", "--json"],
        env=shell_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and all(i in again.stdout for i in sent)


def test_tasks_list_for_a_session_on_no_team_is_not_found_not_a_usage_error(
    shell_env: dict[str, str], register
) -> None:
    shell_env["SWITCHBOARD_TOKEN"] = register("loner").token

    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "tasks", "list"],
        env=shell_env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 3, done.stderr  # 2 is kept for usage errors
    assert "on no team" in done.stderr and "[not_found]" in done.stderr
