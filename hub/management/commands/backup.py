"""`python manage.py backup PATH`: an online backup of the embedded footprint's SQLite database,
taken while the hub serves, into one consistent file (mode 0600). See docs/data.md.

SQLite's online backup API copies the database through this process's own connection in one
step: in WAL mode that is a read transaction, so the serving hub's writers go on meanwhile and
the copy is the database as of the moment the step began. A PostgreSQL hub is backed up with
`pg_dump` instead (this command says so and exits 1)."""

from __future__ import annotations

import os
import secrets
import sqlite3
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from messaging.services.audit import audit_event


class Command(BaseCommand):
    help = "Back up the hub's SQLite database, while it serves, to PATH (written 0600)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="The file to write; an existing file there is replaced.")

    def handle(self, *args: Any, path: str, **options: Any) -> None:
        if connection.vendor != "sqlite":
            raise CommandError(
                f"This hub's database is {connection.vendor}: back it up with "
                "`pg_dump --format=custom` (docs/data.md, PostgreSQL)."
            )
        if connection.in_atomic_block:
            # SQLite's backup cannot read past this connection's own open write transaction: it
            # would wait forever instead of copying.
            raise CommandError("Run the backup outside a transaction.")
        target = Path(path).expanduser().resolve()
        source = Path(str(connection.settings_dict["NAME"])).resolve()
        if target == source:
            raise CommandError("The backup must go to another file than the hub's database.")
        # Written beside the target and moved into place when complete: a file at `target` is
        # always a whole backup, never one cut short.
        partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
        try:
            os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise CommandError(f"Cannot write {target}: {exc.strerror}.") from exc
        try:
            connection.ensure_connection()
            copy = sqlite3.connect(partial)
            try:
                connection.connection.backup(copy)
                (messages,) = copy.execute("SELECT count(*) FROM messaging_message").fetchone()
            finally:
                copy.close()
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        size = target.stat().st_size
        audit_event(
            "hub.backed_up", actor="hub", target=str(target), detail={"messages": messages, "bytes": size}
        )
        self.stdout.write(f"Backed up {messages} messages ({size} bytes) to {target}.")
