"""The embedded database holds every message: its file, and the `-wal` and `-shm` files SQLite keeps
beside it, are readable by their owner alone (0600), like the keys in the same folder."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db.utils import ConnectionHandler

from hub.sqlite.base import DatabaseWrapper, database_file_made_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The umask most accounts have (022): files SQLite creates on its own come out 0644."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_a_new_database_and_its_wal_and_shm_files_are_owner_only(tmp_path, usual_umask) -> None:
    path = tmp_path / "switchboard.sqlite3"
    # The backend's own connect step, on a database of the test's own (the suite's may be
    # PostgreSQL, and pytest-django guards a wrapper's usual way in).
    wrapper = ConnectionHandler({"default": {"ENGINE": "hub.sqlite", "NAME": str(path)}})["default"]
    assert isinstance(wrapper, DatabaseWrapper)
    sqlite = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        sqlite.execute("PRAGMA journal_mode=WAL")
        sqlite.execute("CREATE TABLE t (x INTEGER)")
        sqlite.execute("INSERT INTO t VALUES (1)")
        sqlite.commit()
        files = [path, tmp_path / "switchboard.sqlite3-wal", tmp_path / "switchboard.sqlite3-shm"]
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    finally:
        sqlite.close()


def test_an_older_database_in_the_home_folder_is_tightened_and_one_elsewhere_left_alone(
    tmp_path, settings
) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(mode=0o700)
    elsewhere.mkdir()
    settings.SWITCHBOARD_HOME = home
    older = [home / "switchboard.sqlite3", home / "switchboard.sqlite3-wal"]
    theirs = elsewhere / "their.sqlite3"
    for file in [*older, theirs]:
        file.write_bytes(b"")
        file.chmod(0o644)

    database_file_made_private(str(older[0]))
    database_file_made_private(str(theirs))

    assert [mode(f) for f in older] == [0o600, 0o600]
    assert mode(theirs) == 0o644  # a file the user pointed the hub at is theirs to set


def test_a_database_in_a_missing_folder_is_left_to_sqlite_to_refuse(tmp_path) -> None:
    database_file_made_private(str(tmp_path / "missing" / "switchboard.sqlite3"))
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("name", [":memory:", "file:memorydb_default?mode=memory&cache=shared", ""])
def test_in_memory_databases_create_no_file(tmp_path, monkeypatch, name) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    database_file_made_private(name)
    assert list(empty.iterdir()) == []
