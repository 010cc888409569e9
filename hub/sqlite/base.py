"""Django's SQLite backend, with this process's write transactions queued on a lock.

SQLite lets one connection write at a time. The hub starts every transaction with
`BEGIN IMMEDIATE` (hub.settings), so a second writer waits in SQLite's busy handler, which
sleeps between tries (1, 2, 5, 10 ms and longer), so concurrent writers would sleep while the
processor idles. Threads of one process queue on a lock per database file instead, and each starts
as soon as the writer before it commits or rolls back.

The lock only orders this process's writers. SQLite's own locking still does the guarding: a
thread that has not got the lock within the connection's timeout goes ahead and waits in SQLite's
busy handler, and other processes (a management command, a second hub) never see the lock.

The database holds every message, so its file is its owner's alone (0600), like the keys beside
it: created so before SQLite opens it, which gives its `-wal` and `-shm` files the same mode.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.backends.sqlite3 import base

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def write_lock(name: str) -> threading.Lock:
    """The lock writers of database file `name` queue on in this process."""
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


def database_file_made_private(name: object) -> None:
    """Make the database file `name` owner-only (0600) before SQLite opens it: created so when
    missing; tightened when it lies in the hub's home folder and others may read it (a file made
    by an earlier version). In-memory databases, and files elsewhere that exist, are left as
    they are."""
    if not isinstance(name, str | Path) or str(name) in ("", ":memory:") or str(name).startswith("file:"):
        return
    path = Path(name)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    except FileExistsError:
        pass
    except OSError:  # no such folder, no permission: SQLite says so, in its own words, when it opens
        return
    if path.resolve().parent != Path(settings.SWITCHBOARD_HOME).resolve():
        return
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if stat.S_IMODE(file.stat().st_mode) & 0o077:
                file.chmod(0o600)
        except FileNotFoundError:
            continue


class DatabaseWrapper(base.DatabaseWrapper):
    _write_lock_held: threading.Lock | None = None

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        database_file_made_private(conn_params.get("database"))
        return super().get_new_connection(conn_params)

    def _start_transaction_under_autocommit(self) -> None:
        if self.transaction_mode == "IMMEDIATE" and self._write_lock_held is None:
            lock = write_lock(str(self.settings_dict["NAME"]))
            if lock.acquire(timeout=float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))):
                self._write_lock_held = lock
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._write_lock_released()
            raise

    def _commit(self) -> Any:
        try:
            return super()._commit()
        finally:
            self._write_lock_released()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()
        finally:
            self._write_lock_released()

    def _close(self) -> Any:
        try:
            return super()._close()
        finally:
            self._write_lock_released()

    def _write_lock_released(self) -> None:
        lock, self._write_lock_held = self._write_lock_held, None
        if lock is not None:
            lock.release()
