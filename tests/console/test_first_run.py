"""A newcomer's first run, from a clean clone: each wrong turn found by trying it is pinned here.

`scripts/serve` installs once and starts offline after that; the console names a command that works
to make an operator (no system Python, no manage.py in the current folder); `/favicon.ico` exists;
an empty dashboard says what to do next; an empty SWITCHBOARD_TOKEN is called out, not treated as
"no session" in general."""

from __future__ import annotations

import os
import shutil
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import load_command_class

from console import shell_lines
from switchboard_agent.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_favicon_is_served_and_linked(operator_client):
    icon = operator_client.get("/favicon.ico")
    assert icon.status_code == 200
    assert b"".join(icon.streaming_content)[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
    assert b'rel="icon"' in operator_client.get("/").content


def test_operator_create_help_names_the_flag_it_takes():
    command = load_command_class("console", "operator_create")
    text = command.create_parser("switchboard manage", "operator_create").format_help()
    assert "--no-admin" in text
    assert "--admin" not in text.replace("--no-admin", "")


def test_switchboard_manage_runs_a_management_command(transactional_db, monkeypatch):
    """Django closes the database connections when a command ends (run_from_argv), so the test runs
    outside a wrapping transaction: on PostgreSQL its next query opens a new connection."""
    monkeypatch.setattr("sys.stdin", StringIO("a-long-enough-password\n"))
    assert main(["manage", "operator_create", "grace", "--password-stdin"]) == 0
    assert get_user_model().objects.get(username="grace").is_staff
    monkeypatch.setattr("sys.stdin", StringIO("short\n"))
    assert main(["manage", "operator_create", "grace", "--password-stdin"]) == 1  # CommandError


def test_the_login_page_hints_a_command_that_works_outside_the_repository(db, client, tmp_path):
    """The hinted line is run as printed, from another folder with a fresh home: no manage.py there,
    and the interpreter is the hub's own (the system Python may lack Django)."""
    hint = client.get("/login/").context["create_operator"]
    assert "manage.py" not in hint and hint.endswith(" manage operator_create NAME")
    program = hint.split(" manage ")[0]
    assert Path(program).is_file(), hint  # the full path beside this interpreter: works off PATH
    env = {**os.environ, "SWITCHBOARD_HOME": str(tmp_path / "home")}
    env["SWITCHBOARD_OPERATOR_PASSWORD"] = "correct-horse-battery"
    for name in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    run = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    migrated = subprocess.run([program, "manage", "migrate", "-v0"], **run)
    assert migrated.returncode == 0, migrated.stderr
    made = subprocess.run(hint.replace("NAME", "ada").split(), **run)
    assert made.returncode == 0, made.stderr
    assert "Operator 'ada' created" in made.stdout


def test_an_empty_dashboard_says_what_to_do_next(operator_client, register):
    empty = operator_client.get("/")
    steps = empty.context["first_steps"]
    assert "switchboard register --name alice --save alice" in steps
    assert "switchboard register --name bob --save bob" in steps
    assert any(line.startswith("switchboard --session alice send bob ") for line in steps)
    assert "export SWITCHBOARD_URL=http://testserver" in steps  # not the CLI's default hub
    assert f"export SWITCHBOARD_HOME={settings.SWITCHBOARD_HOME}" in steps  # the tests' own home
    assert b"switchboard register --name bob --save bob" in empty.content
    register("alice")
    assert b"--save bob" not in operator_client.get("/").content


def test_first_steps_name_no_hub_and_no_home_when_they_are_the_defaults():
    steps = shell_lines.first_steps("http://127.0.0.1:8765/", Path.home() / ".switchboard")
    assert not any("SWITCHBOARD_URL" in line or "SWITCHBOARD_HOME" in line for line in steps)


def test_an_empty_token_is_called_out(monkeypatch, capsys):
    """`export SWITCHBOARD_TOKEN=$(switchboard register ...)` with no `switchboard` on PATH exports an
    empty token: the next command says so rather than only that there is no session."""
    monkeypatch.setenv("SWITCHBOARD_TOKEN", "")
    assert main(["inbox"]) == 2
    assert "SWITCHBOARD_TOKEN is set but empty" in capsys.readouterr().err


@pytest.fixture
def fake_checkout(tmp_path: Path) -> Path:
    """A copy of scripts/serve and pyproject.toml over a .venv whose pip and switchboard only log."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "serve", tmp_path / "scripts" / "serve")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "log"
    scripts = {
        "python": "#!/bin/sh\nexit 0\n",
        "pip": f'#!/bin/sh\necho "pip $*" >> {log}\nprintf \'#!/bin/sh\\necho "serve $*" >> {log}\\n\' '
        f"> {bin_dir / 'switchboard'}\nchmod +x {bin_dir / 'switchboard'}\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def test_serve_installs_only_when_missing_or_when_pyproject_changed(fake_checkout: Path):
    def serve() -> list[str]:
        log = fake_checkout / "log"
        log.unlink(missing_ok=True)
        done = subprocess.run(
            [str(fake_checkout / "scripts" / "serve"), "--port", "9"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return [line.split()[0] for line in log.read_text().splitlines()]

    assert serve() == ["pip", "serve"]  # first run: installs
    assert serve() == ["serve"]  # then starts at once, without the package index
    with (fake_checkout / "pyproject.toml").open("a") as f:
        f.write("\n# a changed dependency\n")
    assert serve() == ["pip", "serve"]
    assert serve() == ["serve"]
    (fake_checkout / ".venv" / "bin" / "switchboard").unlink()
    assert serve() == ["pip", "serve"]
