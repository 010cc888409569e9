"""The secrets a hub keeps in its home: made once, 0600, the same for every process that reads them."""

from __future__ import annotations

import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from console import home
from console.home import read_or_create_secret

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    monkeypatch.setenv("SWITCHBOARD_HOME", str(folder))
    return folder


def test_a_secret_is_made_once_and_only_its_owner_can_read_it(hub_home: Path) -> None:
    first = read_or_create_secret("enroll.key")
    assert first and read_or_create_secret("enroll.key") == first
    assert stat.S_IMODE((hub_home / "enroll.key").stat().st_mode) == 0o600


def test_a_process_that_finds_the_file_being_written_waits_for_the_secret(hub_home: Path) -> None:
    """Another process created the file (O_EXCL) and has not written it yet: the secret is what
    it writes, never the empty file."""
    hub_home.mkdir(mode=0o700)
    path = hub_home / "secret.key"
    path.touch(mode=0o600)

    def the_other_process_writes() -> None:
        time.sleep(0.2)
        path.write_text("written-by-the-first\n", encoding="utf-8")

    writer = threading.Thread(target=the_other_process_writes)
    writer.start()
    try:
        assert read_or_create_secret("secret.key") == "written-by-the-first"
    finally:
        writer.join()


def test_an_empty_secret_file_is_a_clear_error_naming_it(
    hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_home.mkdir(mode=0o700)
    (hub_home / "enroll.key").touch(mode=0o600)
    monkeypatch.setattr(home, "SECRET_WRITE_WAIT", 0.05)
    with pytest.raises(ImproperlyConfigured, match=r"enroll\.key is empty\. Delete it"):
        read_or_create_secret("enroll.key")


def test_processes_starting_together_share_one_secret(hub_home: Path) -> None:
    """Eight processes on one new home, released at once, five times over: one secret each time."""
    script = (
        "import sys, time\n"
        "from console.home import read_or_create_secret\n"
        "start = float(sys.argv[1])\n"
        "time.sleep(max(0.0, start - time.time()))\n"
        "print(read_or_create_secret('secret.key'))\n"
    )
    for round_ in range(5):
        folder = hub_home / f"round{round_}"
        env = {"SWITCHBOARD_HOME": str(folder), "PATH": "/usr/bin:/bin"}
        start = time.time() + 1.0
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(start)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        seen = {run.communicate(timeout=30)[0].strip() for run in runs}
        assert all(run.returncode == 0 for run in runs)
        assert len(seen) == 1 and "" not in seen, seen
