"""Per-recipient unread counts, kept by triggers on the delivery table (see models.UnreadCount).

The unread states are written out here, as a migration must not change with the code: a test
checks that they are still `limits.UNREAD_STATES`. PostgreSQL uses statement triggers with
transition tables, so a statement that moves many deliveries writes each recipient's count once,
in recipient order (two such statements cannot deadlock on the counts). SQLite, which runs one
writer at a time, uses row triggers.
"""

import django.db.models.deletion
from django.db import migrations, models

UNREAD = "('queued', 'delivered')"
STRIPES = 8  # PostgreSQL: count rows per recipient, by connection

POSTGRESQL = f"""
CREATE FUNCTION messaging_unread_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO messaging_unreadcount AS c (recipient_id, stripe, n)
      SELECT recipient_id, pg_backend_pid() % {STRIPES}, count(*) FROM new_rows
      WHERE state IN {UNREAD} GROUP BY recipient_id ORDER BY recipient_id
      ON CONFLICT (recipient_id, stripe) DO UPDATE SET n = c.n + excluded.n;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO messaging_unreadcount AS c (recipient_id, stripe, n)
      SELECT recipient_id, pg_backend_pid() % {STRIPES}, -count(*) FROM old_rows
      WHERE state IN {UNREAD} GROUP BY recipient_id ORDER BY recipient_id
      ON CONFLICT (recipient_id, stripe) DO UPDATE SET n = c.n + excluded.n;
  ELSE
    INSERT INTO messaging_unreadcount AS c (recipient_id, stripe, n)
      SELECT recipient_id, pg_backend_pid() % {STRIPES}, sum(change) FROM (
          SELECT recipient_id, 1 AS change FROM new_rows WHERE state IN {UNREAD}
          UNION ALL
          SELECT recipient_id, -1 FROM old_rows WHERE state IN {UNREAD}
        ) AS changes
      GROUP BY recipient_id HAVING sum(change) <> 0 ORDER BY recipient_id
      ON CONFLICT (recipient_id, stripe) DO UPDATE SET n = c.n + excluded.n;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER messaging_unread_insert AFTER INSERT ON messaging_delivery
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION messaging_unread_apply();
CREATE TRIGGER messaging_unread_update AFTER UPDATE ON messaging_delivery
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION messaging_unread_apply();
CREATE TRIGGER messaging_unread_delete AFTER DELETE ON messaging_delivery
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION messaging_unread_apply();
"""

POSTGRESQL_REVERSE = """
DROP TRIGGER messaging_unread_insert ON messaging_delivery;
DROP TRIGGER messaging_unread_update ON messaging_delivery;
DROP TRIGGER messaging_unread_delete ON messaging_delivery;
DROP FUNCTION messaging_unread_apply();
"""


def _sqlite_change(row: str, change: str) -> str:
    return (
        f"INSERT INTO messaging_unreadcount (recipient_id, stripe, n) VALUES ({row}.recipient_id, 0, {change}) "
        f"ON CONFLICT (recipient_id, stripe) DO UPDATE SET n = n + ({change});"
    )


SQLITE = [
    f"""CREATE TRIGGER messaging_unread_insert AFTER INSERT ON messaging_delivery
        WHEN NEW.state IN {UNREAD} BEGIN {_sqlite_change("NEW", "1")} END""",
    f"""CREATE TRIGGER messaging_unread_delete AFTER DELETE ON messaging_delivery
        WHEN OLD.state IN {UNREAD} BEGIN {_sqlite_change("OLD", "-1")} END""",
    f"""CREATE TRIGGER messaging_unread_leave AFTER UPDATE OF state, recipient_id ON messaging_delivery
        WHEN OLD.state IN {UNREAD} AND NOT (NEW.state IN {UNREAD} AND NEW.recipient_id = OLD.recipient_id)
        BEGIN {_sqlite_change("OLD", "-1")} END""",
    f"""CREATE TRIGGER messaging_unread_enter AFTER UPDATE OF state, recipient_id ON messaging_delivery
        WHEN NEW.state IN {UNREAD} AND NOT (OLD.state IN {UNREAD} AND NEW.recipient_id = OLD.recipient_id)
        BEGIN {_sqlite_change("NEW", "1")} END""",
]
SQLITE_TRIGGERS = ["insert", "delete", "leave", "enter"]

BACKFILL = f"""
INSERT INTO messaging_unreadcount (recipient_id, stripe, n)
SELECT recipient_id, 0, COUNT(*) FROM messaging_delivery WHERE state IN {UNREAD} GROUP BY recipient_id
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
            f"Unread count triggers are written for PostgreSQL and SQLite, not {vendor}."
        )
    schema_editor.execute(BACKFILL)


def triggers_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_REVERSE)
    else:
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER messaging_unread_{name}")


class Migration(migrations.Migration):
    dependencies = [
        ("messaging", "0003_drop_indexes_covered_by_composites"),
    ]

    operations = [
        migrations.CreateModel(
            name="UnreadCount",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "recipient", "stripe", blank=True, editable=False, primary_key=True, serialize=False
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
            ],
        ),
        migrations.RunPython(triggers_create, triggers_drop),
    ]
