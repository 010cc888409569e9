"""Backup and restore under load, for both footprints (docs/data.md): a backup taken while
senders are sending, restored into a new home (SQLite) or a new database (PostgreSQL), holds every
message the hub answered before the backup began."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from hub_topology import REPO
from hub_topology.embedded import start_hub
from tests.integration.harness import (
    Hub,
    RedisServer,
    Registered,
    database_create,
    database_drop,
    pg_bin,
    wait_until,
)
from tests.integration.ledger import LOAD_ENV, Ledger, SendLoad

pytestmark = pytest.mark.integration

# What a restore copies from the old home beside the database (docs/data.md, Restore).
HOME_FILES = ("hub.key", "enroll.key", "secret.key")


def _register(url: str, key: str, name: str) -> Registered:
    r = httpx.post(f"{url}/api/v1/sessions", json={"name": name}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 201, r.text
    body = r.json()
    return Registered(id=body["id"], name=body["name"], ref=body["ref"], token=body["token"])


def _loads(url: str, a: Registered, b: Registered, ledger: Ledger) -> list[SendLoad]:
    """Two senders, a → b and b → a, sending unique texts as fast as the hub answers."""
    loads = [
        SendLoad(url, a, b.ref, ledger, count=5000, deadline=90),
        SendLoad(url, b, a.ref, ledger, count=5000, deadline=90),
    ]
    for load in loads:
        load.start()
    return loads


def _answered_now(ledger: Ledger) -> set[str]:
    with ledger.lock:
        return set(ledger.accepted)


def _halt(loads: list[SendLoad]) -> None:
    for load in loads:
        load.halt.set()
    for load in loads:
        load.join(timeout=60)


def test_sqlite_backup_while_serving_restores_into_a_new_home_with_every_answered_message(tmp_path: Path):
    # Given `switchboard serve` on the embedded defaults with two senders writing to each other
    old_home, new_home = tmp_path / "old-home", tmp_path / "new-home"
    old_home.mkdir(mode=0o700)
    new_home.mkdir(mode=0o700)
    hub = start_hub(old_home, extra_env=LOAD_ENV)
    ledger = Ledger()
    try:
        alice = _register(hub.url, hub.enroll_key, "alice")
        bob = _register(hub.url, hub.enroll_key, "bob")
        loads = _loads(hub.url, alice, bob, ledger)
        wait_until(lambda: len(_answered_now(ledger)) >= 200, timeout=60, what="200 answered sends")

        # When an operator backs the database up while the senders go on
        answered_before = _answered_now(ledger)
        backup = tmp_path / "backup.sqlite3"
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        done = subprocess.run(
            [sys.executable, "manage.py", "backup", str(backup)],
            cwd=REPO,
            env={**env, "SWITCHBOARD_HOME": str(old_home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        answered_after = _answered_now(ledger)
        _halt(loads)
    finally:
        hub.stop()
    assert len(answered_after) > len(answered_before), "the senders were not sending during the backup"
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600

    # And restores it: the hub stopped, the file and the home's keys copied into a new home
    shutil.copyfile(backup, new_home / "switchboard.sqlite3")
    for name in HOME_FILES:
        shutil.copy2(old_home / name, new_home / name)
    restored = start_hub(new_home)
    try:
        # Then the new hub serves the old sessions (their tokens) and its enroll key still registers
        with httpx.Client(base_url=restored.url, timeout=30) as c:
            inbox = c.get("/api/v1/inbox", headers=alice.headers, params={"limit": 1})
            assert inbox.status_code == 200, inbox.text
        _register(restored.url, (old_home / "enroll.key").read_text().strip(), "carol")
        # And every message answered before the backup began is there
        with sqlite3.connect(new_home / "switchboard.sqlite3") as db:
            stored = {row[0] for row in db.execute("SELECT id FROM messaging_message")}
    finally:
        restored.stop()
    missing = {uuid.UUID(m).hex for m in answered_before} - stored
    assert not missing, f"{len(missing)} of {len(answered_before)} answered messages are not in the backup"


def test_pg_dump_under_load_restores_into_a_new_database_with_every_answered_message(
    fresh_database: Callable[[], str], make_hub: Callable[..., Hub], tmp_path: Path
):
    # Given the production topology (daphne, Celery worker) with two senders writing to each other
    redis = RedisServer(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    redis.start()
    restored_url = ""
    try:
        source_url = fresh_database()
        hub = make_hub(
            database_url=source_url,
            redis_url=redis.url(),
            webs=1,
            beat=False,
            migrate=False,
            extra_env=LOAD_ENV,
        )
        url = hub.web_urls[0]
        alice, bob = hub.register("alice"), hub.register("bob")
        ledger = Ledger()
        loads = _loads(url, alice, bob, ledger)
        wait_until(lambda: len(_answered_now(ledger)) >= 200, timeout=60, what="200 answered sends")

        # When an operator runs pg_dump while the senders go on
        answered_before = _answered_now(ledger)
        dump = tmp_path / "switchboard.dump"
        subprocess.run(
            [pg_bin("pg_dump"), "--format=custom", "--no-owner", "--file", str(dump), source_url],
            check=True,
            capture_output=True,
            timeout=120,
        )
        answered_after = _answered_now(ledger)
        _halt(loads)
        hub.stop()
        assert len(answered_after) > len(answered_before), "the senders were not sending during the dump"

        # And restores it into a new, empty database
        restored_url = database_create(prefix="sb_prod_restored_")
        subprocess.run(
            [pg_bin("pg_restore"), "--no-owner", "--exit-on-error", "--dbname", restored_url, str(dump)],
            check=True,
            capture_output=True,
            timeout=120,
        )

        # Then a hub on the restored database serves the old sessions, and every message answered
        # before the dump began is there
        again = make_hub(
            database_url=restored_url, redis_url=redis.url(1), webs=1, worker=False, beat=False, migrate=False
        )
        inbox = httpx.get(
            f"{again.web_urls[0]}/api/v1/inbox", headers=bob.headers, params={"limit": 1}, timeout=30
        )
        assert inbox.status_code == 200, inbox.text
        ids = [uuid.UUID(m) for m in answered_before]
        stored = {row[0] for row in again.sql("SELECT id FROM messaging_message WHERE id = ANY(%s)", ids)}
        missing = set(ids) - stored
        assert not missing, f"{len(missing)} of {len(ids)} answered messages are not in the dump"
    finally:
        redis.stop()
        if restored_url:
            database_drop(restored_url)
