"""The secrets a hub keeps in its home: made once, 0600, the same for every process that reads them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from messaging import home
from messaging.home import read_or_create_secret

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


def test_a_process_that_loses_the_race_to_create_the_file_reads_the_winner_s_secret(
    hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process puts its secret in place between this one's look for the file and its
    own link: this one answers the other's secret, and leaves none of its own behind."""
    real_link = os.link

    def another_process_links_first(source: str, target: Path) -> None:
        Path(target).write_text("written-by-the-other\n", encoding="utf-8")
        real_link(source, target)

    monkeypatch.setattr(home.os, "link", another_process_links_first)
    assert read_or_create_secret("secret.key") == "written-by-the-other"
    assert sorted(p.name for p in hub_home.iterdir()) == ["secret.key"]


def test_a_secret_that_could_not_be_written_leaves_no_file(
    hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk) leaves neither an empty secret file, which every later
    start would refuse, nor the half-written one beside it."""

    def disk_full(fd: int, *args: object, **kwargs: object) -> None:
        os.close(fd)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched, pytest.raises(OSError, match="No space left"):
        patched.setattr(home.os, "fdopen", disk_full)
        read_or_create_secret("enroll.key")
    assert list(hub_home.iterdir()) == []
    assert read_or_create_secret("enroll.key")  # the disk has room again: the next start makes it
    assert [p.name for p in hub_home.iterdir()] == ["enroll.key"]


def test_an_empty_secret_file_is_a_clear_error_naming_it(hub_home: Path) -> None:
    hub_home.mkdir(mode=0o700)
    (hub_home / "enroll.key").touch(mode=0o600)
    with pytest.raises(ImproperlyConfigured, match=r"enroll\.key is empty\. Delete it"):
        read_or_create_secret("enroll.key")


def test_processes_starting_together_share_one_secret(hub_home: Path) -> None:
    """Eight processes on one new home, released at once, five times over: one secret each time."""
    script = (
        "import sys, time\n"
        "from messaging.home import read_or_create_secret\n"
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
