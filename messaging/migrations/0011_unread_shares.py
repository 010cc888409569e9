"""Per-(recipient, sender) unread counts, kept by triggers on the delivery table (see
models.UnreadShare): what bounds one sender's share of a recipient's unread cap.

Kept as 0004 keeps the recipient's count (its unread states and stripes written out here, checked
against `limits.UNREAD_STATES` by a test), with the sender read from each delivery's message by its
primary key; a message with no sender (a hub notice) is not counted. PostgreSQL: statement
triggers with transition tables, each (recipient, sender) count written once per statement, in
(recipient, sender) order, so two such statements cannot deadlock on them; an update looks a
message up only for the deliveries whose unread state it changed. SQLite: row triggers. On PostgreSQL
the triggers fire after 0004's (triggers of one event fire in name order, and
"messaging_unread_" sorts before "messaging_unreadshare_"), so every statement takes the
recipient's count row before any sender's.
"""

import django.db.models.deletion
from django.db import migrations, models

UNREAD = "('queued', 'delivered')"
STRIPES = 8  # PostgreSQL: count rows per (recipient, sender), by connection, as 0004's

# The sender of delivery row `d`, one primary-key probe of the message table per row.
_SENDER = "(SELECT m.sender_id FROM messaging_message m WHERE m.id = d.message_id)"

_UPSERT = (
    "INSERT INTO messaging_unreadshare AS c (recipient_id, sender_id, stripe, n) "
    f"SELECT recipient_id, sender_id, pg_backend_pid() % {STRIPES}, sum(change) FROM ({{rows}}) AS rows "
    "WHERE sender_id IS NOT NULL GROUP BY recipient_id, sender_id HAVING sum(change) <> 0 "
    "ORDER BY recipient_id, sender_id "
    "ON CONFLICT (recipient_id, sender_id, stripe) DO UPDATE SET n = c.n + excluded.n;"
)


def _rows(table: str, change: int) -> str:
    return (
        f"SELECT d.recipient_id, {_SENDER} AS sender_id, {change} AS change FROM {table} d "
        f"WHERE d.state IN {UNREAD} OFFSET 0"
    )


# An update: the deliveries whose unread state changed (+1 entering, -1 leaving), then their senders.
_CHANGED = (
    f"SELECT d.recipient_id, {_SENDER} AS sender_id, d.change FROM ("
    f"SELECT recipient_id, message_id, sum(change) AS change FROM ("
    f"SELECT recipient_id, message_id, 1 AS change FROM new_rows WHERE state IN {UNREAD} "
    f"UNION ALL SELECT recipient_id, message_id, -1 FROM old_rows WHERE state IN {UNREAD}"
    ") AS moves GROUP BY recipient_id, message_id HAVING sum(change) <> 0 OFFSET 0) AS d"
)

POSTGRESQL = f"""
CREATE FUNCTION messaging_unreadshare_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    {_UPSERT.format(rows=_rows("new_rows", 1))}
  ELSIF TG_OP = 'DELETE' THEN
    {_UPSERT.format(rows=_rows("old_rows", -1))}
  ELSE
    {_UPSERT.format(rows=_CHANGED)}
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER messaging_unreadshare_insert AFTER INSERT ON messaging_delivery
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION messaging_unreadshare_apply();
CREATE TRIGGER messaging_unreadshare_update AFTER UPDATE ON messaging_delivery
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION messaging_unreadshare_apply();
CREATE TRIGGER messaging_unreadshare_delete AFTER DELETE ON messaging_delivery
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION messaging_unreadshare_apply();
"""

POSTGRESQL_REVERSE = """
DROP TRIGGER messaging_unreadshare_insert ON messaging_delivery;
DROP TRIGGER messaging_unreadshare_update ON messaging_delivery;
DROP TRIGGER messaging_unreadshare_delete ON messaging_delivery;
DROP FUNCTION messaging_unreadshare_apply();
"""


def _sqlite_change(row: str, change: str) -> str:
    return (
        "INSERT INTO messaging_unreadshare (recipient_id, sender_id, stripe, n) "
        f"SELECT {row}.recipient_id, m.sender_id, 0, {change} FROM messaging_message m "
        f"WHERE m.id = {row}.message_id AND m.sender_id IS NOT NULL "
        f"ON CONFLICT (recipient_id, sender_id, stripe) DO UPDATE SET n = n + ({change});"
    )


SQLITE = [
    f"""CREATE TRIGGER messaging_unreadshare_insert AFTER INSERT ON messaging_delivery
        WHEN NEW.state IN {UNREAD} BEGIN {_sqlite_change("NEW", "1")} END""",
    f"""CREATE TRIGGER messaging_unreadshare_delete AFTER DELETE ON messaging_delivery
        WHEN OLD.state IN {UNREAD} BEGIN {_sqlite_change("OLD", "-1")} END""",
    f"""CREATE TRIGGER messaging_unreadshare_leave AFTER UPDATE OF state, recipient_id ON messaging_delivery
        WHEN OLD.state IN {UNREAD} AND NOT (NEW.state IN {UNREAD} AND NEW.recipient_id = OLD.recipient_id)
        BEGIN {_sqlite_change("OLD", "-1")} END""",
    f"""CREATE TRIGGER messaging_unreadshare_enter AFTER UPDATE OF state, recipient_id ON messaging_delivery
        WHEN NEW.state IN {UNREAD} AND NOT (OLD.state IN {UNREAD} AND NEW.recipient_id = OLD.recipient_id)
        BEGIN {_sqlite_change("NEW", "1")} END""",
]
SQLITE_TRIGGERS = ["insert", "delete", "leave", "enter"]

BACKFILL = f"""
INSERT INTO messaging_unreadshare (recipient_id, sender_id, stripe, n)
SELECT d.recipient_id, m.sender_id, 0, COUNT(*)
FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
WHERE d.state IN {UNREAD} AND m.sender_id IS NOT NULL
GROUP BY d.recipient_id, m.sender_id
"""


def triggers_create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRESQL, None)  # no parameters: its % is the modulo
    elif vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(statement)
    else:
        raise NotImplementedError(
            f"Unread share triggers are written for PostgreSQL and SQLite, not {vendor}."
        )
    schema_editor.execute(BACKFILL)


def triggers_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_REVERSE)
    else:
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER messaging_unreadshare_{name}")


class Migration(migrations.Migration):
    dependencies = [
        ("messaging", "0010_session_registration_key"),
    ]

    operations = [
        migrations.CreateModel(
            name="UnreadShare",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "recipient",
                        "sender",
                        "stripe",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("stripe", models.SmallIntegerField()),
                ("n", models.IntegerField()),
                (
                    "recipient",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="messaging.agentsession",
                    ),
                ),
                (
                    "sender",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="messaging.agentsession",
                    ),
                ),
            ],
        ),
        migrations.RunPython(triggers_create, triggers_drop),
    ]
