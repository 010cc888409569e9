"""`switchboard web` (hub/web.py): daphne with the hub's application, on uvloop's event loop.

Choosing the loop only works before `daphne.server` is imported, and this test process imported
it long ago (Django's app registry does), so the loop itself is checked in fresh interpreters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub.web import APPLICATION, daphne_arguments, event_loop_chosen
from switchboard_agent import cli

REPO = Path(__file__).resolve().parents[2]

LOOP_OF_DAPHNE = """
from hub.web import event_loop_chosen
chosen = event_loop_chosen()
import daphne.server
from twisted.internet import reactor
print(chosen, type(daphne.server.twisted_loop).__module__, reactor._asyncioEventloop is daphne.server.twisted_loop)
"""


def _python(*arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with `arguments`, in the repository, SWITCHBOARD_EVENT_LOOP from `env` only."""
    clean = {k: v for k, v in os.environ.items() if k != "SWITCHBOARD_EVENT_LOOP"}
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=REPO,
        env={**clean, "DJANGO_SETTINGS_MODULE": "hub.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_daphne_runs_its_reactor_on_uvloop_by_default() -> None:
    pytest.importorskip("uvloop")
    run = _python("-c", LOOP_OF_DAPHNE)

    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["uvloop", "uvloop", "True"]


def test_the_standard_loop_can_be_kept() -> None:
    run = _python("-c", LOOP_OF_DAPHNE, SWITCHBOARD_EVENT_LOOP="asyncio")

    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["asyncio", "asyncio.unix_events", "True"]


def test_an_unknown_loop_name_is_refused_with_the_names_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_EVENT_LOOP", "trio")

    with pytest.raises(ValueError, match="one of uvloop, asyncio, not 'trio'"):
        event_loop_chosen()


def test_choosing_after_daphne_made_its_loop_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import daphne.server  # noqa: F401 - as Django's app registry imports it

    monkeypatch.delenv("SWITCHBOARD_EVENT_LOOP", raising=False)
    with pytest.raises(RuntimeError, match="already imported"):
        event_loop_chosen()


@pytest.mark.parametrize(
    ("given", "passed"),
    [
        ([], [APPLICATION]),
        (["-b", "127.0.0.1", "-p", "8001"], ["-b", "127.0.0.1", "-p", "8001", APPLICATION]),
        (["-b", "::1", "-p", "8001"], ["-b", "::1", "-p", "8001", APPLICATION]),  # not an application
        (["-p", "8001", "--proxy-headers"], ["-p", "8001", "--proxy-headers", APPLICATION]),
        (["-p", "8001", "other.asgi:app"], ["-p", "8001", "other.asgi:app"]),
        (["--help"], ["--help"]),
    ],
)
def test_the_hubs_application_is_served_unless_another_is_named(given: list[str], passed: list[str]) -> None:
    assert daphne_arguments(given) == passed


def test_the_cli_hands_everything_after_web_to_daphne(monkeypatch: pytest.MonkeyPatch) -> None:
    import hub.web

    seen: list[list[str]] = []
    monkeypatch.setattr(hub.web, "run_web", lambda argv: seen.append(list(argv)) or 0)

    assert cli.main(["web", "-b", "127.0.0.1", "-p", "8001", "--help"]) == 0
    assert seen == [["-b", "127.0.0.1", "-p", "8001", "--help"]]


def test_switchboard_web_help_is_daphnes() -> None:
    run = _python("-m", "switchboard_agent.cli", "web", "--help")

    assert run.returncode == 0, run.stderr
    assert "--proxy-headers" in run.stdout
    assert "daphne on the" in run.stderr  # which loop it chose, before daphne's own output


def test_a_mistyped_loop_name_stops_web_and_serve_with_a_usage_error(tmp_path: Path) -> None:
    for command in (["web"], ["serve", "--port", "1"]):
        run = _python(
            "-m",
            "switchboard_agent.cli",
            *command,
            SWITCHBOARD_EVENT_LOOP="uv-loop",
            SWITCHBOARD_HOME=str(tmp_path),
        )

        assert run.returncode == 2, run.stderr
        assert "SWITCHBOARD_EVENT_LOOP must be one of uvloop, asyncio, not 'uv-loop'" in run.stderr
        assert "Traceback" not in run.stderr
