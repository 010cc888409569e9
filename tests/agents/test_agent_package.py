"""The agent side (`switchboard_agent`) is a package of its own: it imports and runs with none of the
hub's dependencies (Django, channels, daphne, Celery...) and none of the hub's packages, and the
hub commands say which extra brings the hub when it is not there.

Each case runs in a fresh interpreter whose import system refuses the hub's modules and records
every attempt, so an agent module that imports one fails here even if it catches the ImportError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hub_topology import free_port

REPO = Path(__file__).resolve().parents[2]

# The hub's own packages (installed with the agent side, never imported by it).
HUB_PACKAGES = ("console", "messaging", "teams", "federation")
# What the `hub` (and `lan`) extra installs: absent where only the agent side is installed.
HUB_DEPENDENCIES = (
    "django",
    "channels",
    "channels_redis",
    "daphne",
    "twisted",
    "celery",
    "kombu",
    "redis",
    "ninja",
    "psycopg",
    "psycopg_pool",
    "dj_database_url",
    "nacl",
    "orjson",
    "prometheus_client",
    "uvloop",
    "axes",
    "zeroconf",
)

WITHOUT_THE_HUB = """
import importlib.abc, json, os, sys

BLOCKED = set(json.loads(os.environ["BLOCKED"]))
tried = []

class NoHub(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoHub())

def report():
    with open(os.environ["TRIED_FILE"], "w") as out:
        json.dump(tried, out)

import atexit
atexit.register(report)
"""

IMPORT_EVERY_MODULE = """
import pkgutil, importlib
import switchboard_agent
names = [m.name for m in pkgutil.walk_packages(switchboard_agent.__path__, "switchboard_agent.")]
for name in names:
    importlib.import_module(name)
print(json.dumps(sorted(names)))
"""

RUN_THE_CLI = """
from switchboard_agent.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_the_hub(
    tmp_path: Path,
    script: str,
    *argv: str,
    stdin: str = "",
    blocked: tuple[str, ...] = HUB_PACKAGES + HUB_DEPENDENCIES,
    **env: str,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `script` (with argv) in a fresh interpreter that cannot import the `blocked` modules
    (by default the hub's packages and its dependencies); the finished process and the blocked
    modules something tried to import."""
    tried = tmp_path / f"tried-{time.monotonic_ns()}.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_", "DJANGO_"))}
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_HUB + script, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean
        | {"SWITCHBOARD_HOME": str(tmp_path / "home"), "TRIED_FILE": str(tried)}
        | {"BLOCKED": json.dumps(blocked)}
        | env,
        timeout=60,
    )
    return run, json.loads(tried.read_text()) if tried.exists() else ["(the process did not report)"]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nobody listens there


def test_every_agent_module_imports_without_any_hub_module(tmp_path: Path) -> None:
    run, tried = without_the_hub(tmp_path, IMPORT_EVERY_MODULE)

    assert run.returncode == 0, run.stderr
    imported = json.loads(run.stdout)
    assert {"switchboard_agent.hooks", "switchboard_agent.mcp_server", "switchboard_agent.cli"} <= set(
        imported
    )
    assert tried == []


def test_help_lists_agent_and_hub_commands_without_the_hub(tmp_path: Path) -> None:
    run, tried = without_the_hub(tmp_path, RUN_THE_CLI, "--help")

    assert run.returncode == 0, run.stderr
    for command in ("serve", "web", "hook", "mcp", "send", "inbox", "install-hooks"):
        assert command in run.stdout
    assert tried == []


def test_a_hook_runs_without_the_hub_installed(tmp_path: Path) -> None:
    """A Claude Code PostToolUse event against a hub that is down: exit 0, nothing printed."""
    payload = {
        "session_id": "0d3c7a52-1111-4c2e-9a55-6f0b2d9e8a10",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": str(tmp_path),
        "permission_mode": "default",
        "hook_event_name": "PostToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "make"},
    }
    run, tried = without_the_hub(
        tmp_path, RUN_THE_CLI, "hook", stdin=json.dumps(payload), SWITCHBOARD_URL=closed_port_url()
    )

    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert "PostToolUse" in (tmp_path / "home" / "agent.log").read_text()  # the hook ran and logged
    assert tried == []


def test_hub_commands_without_the_hub_extra_name_the_extra_to_install(tmp_path: Path) -> None:
    """An agent-only install has the hub's packages (one distribution) but not their dependencies."""
    for command in (["serve", "--port", "1"], ["web", "--help"], ["manage", "help"], ["--json", "serve"]):
        run, tried = without_the_hub(tmp_path, RUN_THE_CLI, *command, blocked=HUB_DEPENDENCIES)

        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr
        [line] = run.stderr.strip().splitlines()  # one sentence, nothing before it
        assert line.endswith("install it with: pip install 'switchboard[hub]'")
        assert tried  # the hub was asked for, and only because a hub command ran


def test_a_missing_module_of_the_hub_itself_is_not_mistaken_for_the_missing_extra(tmp_path: Path) -> None:
    run, _ = without_the_hub(
        tmp_path,
        "import hub.cli\nhub.cli.run_hub_command = lambda c, a: __import__('hub.nothing')\n" + RUN_THE_CLI,
        "serve",
        blocked=(),
    )

    assert run.returncode == 1
    assert "No module named 'hub.nothing'" in run.stderr and "pip install" not in run.stderr
