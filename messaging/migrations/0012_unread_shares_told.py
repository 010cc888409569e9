"""The unread share counts a delivery for the session told of its moves, not the message's sender
column: a notice the hub writes in a session's name to a reader that session did not choose (a
fired notify-when-idle subscription, kind notification) is not that session's message, so it does
not count in its share of the reader's unread cap (see `messaging.services.delivery.told_of_moves`).
Otherwise an unread notice would eat the share and the refusal ("has not read N of your
messages") would tell the session it is watched.

0011's triggers rewritten with its sender read as `TOLD` (written out here, as a migration must
not change with the code: a test checks it is still `delivery.TOLD_OF_MOVES_SQL`), the same one
primary-key probe of the message table per row, and the counts rebuilt from the deliveries.
"""

import importlib

from django.db import migrations

SHARES = importlib.import_module("messaging.migrations.0011_unread_shares")

TOLD = "CASE WHEN m.kind = 'notification' THEN NULL ELSE m.sender_id END"
SENDER = "m.sender_id"  # what 0011 reads as the sender, wherever it reads it


def told(sql: str) -> str:
    """0011's SQL with the sender read as `TOLD`."""
    assert SENDER in sql, "0011's SQL reads the sender as m.sender_id"
    return sql.replace(SENDER, f"({TOLD})")


def untold(sql: str) -> str:
    return sql


def _recount(schema_editor, backfill: str) -> None:
    schema_editor.execute("DELETE FROM messaging_unreadshare")
    schema_editor.execute(backfill)


def _rewrite(schema_editor, form) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(SHARES.POSTGRESQL_REVERSE)
        schema_editor.execute(form(SHARES.POSTGRESQL), None)  # no parameters: its % is the modulo
    elif vendor == "sqlite":
        for name in SHARES.SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER messaging_unreadshare_{name}")
        for statement in SHARES.SQLITE:
            schema_editor.execute(form(statement))
    else:
        raise NotImplementedError(f"Unread share triggers are written for PostgreSQL and SQLite, not {vendor}.")
    _recount(schema_editor, form(SHARES.BACKFILL))


def triggers_told(apps, schema_editor):
    _rewrite(schema_editor, told)


def triggers_untold(apps, schema_editor):
    _rewrite(schema_editor, untold)


class Migration(migrations.Migration):
    dependencies = [
        ("messaging", "0011_unread_shares"),
    ]

    operations = [
        migrations.RunPython(triggers_told, triggers_untold),
    ]
