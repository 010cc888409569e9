"""`$SWITCHBOARD_HOME` is used only when no other local user can write in it.

The attack: another local account makes the folder first (`SWITCHBOARD_HOME=/tmp/sb`, a shared
path), or it is group- or world-writable. Files the hub and the agent side write there are 0600,
but whoever can write the folder can put files in place of them, or before them: a `hub.url`
naming the attacker's server (every hook, MCP and CLI request then carries the enrollment key or
a session token there), an `enroll.key` it knows, a saved session with its own token. "Another
user" is simulated with os.chown to uid 65534 (nobody), which needs root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard_agent.config import enroll_key, hub_url, session_find
from switchboard_agent.home import UnsafeHome, home_dir

NOBODY = 65534
ATTACKER_URL = "http://192.0.2.66:8765"
ATTACKER_KEY = "enrollment-key-the-attacker-knows-" + "a" * 10

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user"
)


def _planted(folder: Path) -> Path:
    """What the attacker leaves in a folder it can write, before the victim's first use."""
    (folder / "hub.url").write_text(ATTACKER_URL + "\n")
    (folder / "enroll.key").write_text(ATTACKER_KEY + "\n")
    return folder


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "sb"
    folder.mkdir()
    monkeypatch.setenv("SWITCHBOARD_HOME", str(folder))
    monkeypatch.delenv("SWITCHBOARD_URL", raising=False)
    monkeypatch.delenv("SWITCHBOARD_ENROLL_KEY", raising=False)
    return folder


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o722])
def test_a_home_others_can_write_is_refused(shared: Path, mode: int) -> None:
    _planted(shared).chmod(mode)
    with pytest.raises(UnsafeHome, match="other users can write"):
        hub_url()
    with pytest.raises(UnsafeHome):
        enroll_key("http://127.0.0.1:8765")


@needs_root
def test_a_home_another_user_owns_is_refused(shared: Path) -> None:
    _planted(shared).chmod(0o700)
    os.chown(shared, NOBODY, NOBODY)
    with pytest.raises(UnsafeHome, match="uid 65534"):
        hub_url()
    with pytest.raises(UnsafeHome):
        enroll_key("http://127.0.0.1:8765")
    with pytest.raises(UnsafeHome):
        session_find("planted", ATTACKER_URL)


@needs_root
def test_a_symlink_to_another_users_folder_is_refused(shared: Path, tmp_path: Path, monkeypatch) -> None:
    os.chown(_planted(shared), NOBODY, NOBODY)
    link = tmp_path / "link"
    link.symlink_to(shared)
    monkeypatch.setenv("SWITCHBOARD_HOME", str(link))
    with pytest.raises(UnsafeHome):
        hub_url()


def test_a_private_home_is_used(shared: Path) -> None:
    _planted(shared).chmod(0o700)
    assert hub_url() == ATTACKER_URL  # the folder is this user's own: what is in it stands
    assert enroll_key(hub_url()) == ATTACKER_KEY


def test_a_home_others_can_only_read_is_used(shared: Path) -> None:
    """0755 (a folder made with `mkdir` under umask 022) leaks file names, not contents."""
    shared.chmod(0o755)
    assert home_dir() == shared


def test_a_new_home_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path / "new" / "home"))
    assert (home_dir().stat().st_mode & 0o777) == 0o700


def test_the_cli_says_why_in_one_line(shared: Path) -> None:
    shared.chmod(0o777)
    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "agents"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SWITCHBOARD_TOKEN": "sbs_x"},
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "other users can write" in done.stderr


def test_the_hub_takes_no_secret_from_a_home_others_can_write(shared: Path) -> None:
    """A hub's enrollment key, Django secret and hub key are read from the same folder: one an
    attacker put there first would be the hub's."""
    from messaging.home import read_or_create_secret

    _planted(shared).chmod(0o777)
    with pytest.raises(UnsafeHome):
        read_or_create_secret("enroll.key")


@pytest.mark.django_db
def test_the_hub_stores_no_file_in_a_files_folder_others_can_write(tmp_path: Path, settings) -> None:
    """A stored file is read back by its SHA-256 name: whoever can write the folder could swap the
    bytes every recipient is handed under the sender's name and signed hash."""
    from federation.services.files import file_store

    shared = tmp_path / "files"
    shared.mkdir()
    shared.chmod(0o777)
    settings.SWITCHBOARD_FILES_DIR = shared
    with pytest.raises(UnsafeHome, match="SWITCHBOARD_FILES_DIR"):
        file_store(data=b"a report")
    assert not (shared / "store").exists()
