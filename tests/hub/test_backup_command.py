"""`manage.py backup PATH`: a whole, private copy of the SQLite database (the restore under load
is in tests/integration/test_backup_restore.py); a PostgreSQL hub is told to use pg_dump."""

from __future__ import annotations

import io
import sqlite3
import stat
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from messaging.models import AuditEvent


@pytest.fixture
def on_sqlite(transactional_db):
    """A SQLite hub whose test writes are committed, as a serving hub's are."""
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite footprint's backup")


def test_backup_writes_a_private_copy_holding_every_message(on_sqlite, register, send, tmp_path):
    alice, _ = register("alice"), register("bob")
    sent = [send(alice, "bob", f"note {i}").json_body["id"] for i in range(3)]
    target = tmp_path / "backups" / "backup.sqlite3"
    target.parent.mkdir()
    target.write_text("an older backup")  # replaced whole
    target.chmod(0o644)
    out = io.StringIO()

    call_command("backup", str(target), stdout=out)

    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with sqlite3.connect(target) as copy:
        stored = {row[0] for row in copy.execute("SELECT id FROM messaging_message")}
    assert {uuid.UUID(m).hex for m in sent} <= stored
    assert "Backed up 3 messages" in out.getvalue()
    assert list(target.parent.iterdir()) == [target]  # no partial file left beside it
    [event] = AuditEvent.objects.filter(kind="hub.backed_up")
    assert event.detail["messages"] == 3


def test_backup_refuses_an_unwritable_path(on_sqlite, tmp_path):
    with pytest.raises(CommandError, match="Cannot write"):
        call_command("backup", str(tmp_path / "missing-folder" / "b.sqlite3"), stdout=io.StringIO())


def test_a_backup_inside_a_transaction_is_refused_not_left_waiting(db):
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite footprint's backup")
    with pytest.raises(CommandError, match="outside a transaction"):
        call_command("backup", "/tmp/never-written.sqlite3", stdout=io.StringIO())


def test_a_postgresql_hub_is_told_to_use_pg_dump(db):
    if connection.vendor != "postgresql":
        pytest.skip("the production footprint")
    with pytest.raises(CommandError, match="pg_dump"):
        call_command("backup", "/tmp/never-written.sqlite3", stdout=io.StringIO())
