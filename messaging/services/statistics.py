"""The planner's statistics for the hub's tables, gathered as soon as a table has something to show.

PostgreSQL plans every query from the statistics ANALYZE gathers. Autovacuum runs ANALYZE on a
table once enough of it has changed (`autovacuum_analyze_threshold` rows plus
`autovacuum_analyze_scale_factor` of the table), but only when it gets round to the database,
once every `autovacuum_naptime` (a minute by default), and never when autovacuum is off. Until a
table's first ANALYZE the planner knows nothing of its columns, and may plan a send's reads (the
pair's facts, a batch's read per recipient) as scans of the whole message table, whose cost then
grows with the table.

So the hub applies autovacuum's own rule on its own pace (a periodic job) to a table that has
no statistics yet. With autovacuum off, which would leave those first statistics to stand
however the table grows, it applies the rule to the others too, but at autovacuum's pace: at
most once a naptime per table. (Every ANALYZE makes each connection plan its statements on
that table again, and some of the hub's tables change on every send: no table is analyzed more
often than autovacuum's rule asks.)
PostgreSQL only: SQLite's planner does not wait for statistics in this way.
"""

from __future__ import annotations

import logging

from django.db import connection

log = logging.getLogger(__name__)

_DUE = """
    SELECT s.relname
    FROM pg_stat_user_tables AS s
    JOIN pg_class AS c ON c.oid = s.relid
    WHERE s.schemaname = current_schema()
      AND s.n_mod_since_analyze >= current_setting('autovacuum_analyze_threshold')::float8
          + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0)
      AND (
        NOT EXISTS (SELECT 1 FROM pg_stats AS p WHERE p.schemaname = s.schemaname AND p.tablename = s.relname)
        OR (NOT coalesce(%s::bool, current_setting('autovacuum')::bool)
            AND coalesce(greatest(s.last_analyze, s.last_autoanalyze), '-infinity')
                < now() - coalesce(%s::float8 * interval '1 second', current_setting('autovacuum_naptime')::interval))
      )
    ORDER BY s.relname
"""


def planner_statistics_gathered(*, autovacuum: bool | None = None, naptime: float | None = None) -> list[str]:
    """ANALYZE the hub's tables whose statistics are due by autovacuum's rule and that autovacuum
    would leave waiting: those with none yet, and with autovacuum off, those last analyzed more
    than a naptime ago. Returns their names. `autovacuum` and `naptime` (seconds) stand for the
    server's settings (a test's way to ask for others)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(_DUE, [autovacuum, naptime])
        due = [name for (name,) in cursor.fetchall()]
        if not due:
            return []
        cursor.execute("ANALYZE " + ", ".join(connection.ops.quote_name(name) for name in due))
    log.info("gathered the planner's statistics for %s", ", ".join(due))
    return due
