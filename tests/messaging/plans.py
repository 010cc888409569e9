"""PostgreSQL plans for tests that check how a statement reads its rows, under either kind of plan
a prepared statement may run with."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from django.db import connection

T = TypeVar("T")


def plan_nodes(sql: str, params: list, *, prepare: bool | None = None, mode: str = "") -> list[dict]:
    """Every node of `sql`'s plan, as EXPLAIN ANALYZE ran it. With a `mode`, run as a prepared
    statement under `plan_cache_mode = mode`: `force_generic_plan` (one plan made without the
    values, which PostgreSQL may keep for a prepared statement) or `force_custom_plan` (a plan
    made for these values)."""
    import psycopg

    if not mode:
        with connection.cursor() as cursor:
            cursor.cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params, prepare=prepare)
            pending = [cursor.fetchone()[0][0]["Plan"]]
    else:
        numbered = iter(range(1, sql.count("%s") + 1))
        with psycopg.ClientCursor(connection.connection) as cursor:  # values as literals in EXECUTE
            cursor.execute(f"SET plan_cache_mode = {mode}")
            cursor.execute("PREPARE plan_probe AS " + re.sub("%s", lambda _: f"${next(numbered)}", sql))
            try:
                arguments = ", ".join(["%s"] * len(params))
                cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE plan_probe({arguments})", params)
                pending = [cursor.fetchone()[0][0]["Plan"]]
            finally:
                cursor.execute("DEALLOCATE plan_probe")
                cursor.execute("RESET plan_cache_mode")
    nodes = []
    while pending:
        nodes.append(pending.pop())
        pending.extend(nodes[-1].get("Plans", []))
    return nodes


def rows_read(node: dict) -> int:
    """The rows one node of a plan read in all: those it returned and those its filter or an
    index recheck dropped, over every loop (EXPLAIN gives each count per loop)."""
    dropped = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    return (node.get("Actual Rows", 0) + dropped) * node.get("Actual Loops", 1)


def the_one_statement(call: Callable[[], T]) -> tuple[T, tuple[str, list]]:
    """`call()`'s result, and the one statement it ran, with its parameters."""
    ran: list[tuple[str, list]] = []

    def record(run, sql, params, many, context):
        ran.append((sql, list(params)))
        return run(sql, params, many, context)

    with connection.execute_wrapper(record):
        result = call()
    (statement,) = ran
    return result, statement
