"""The hub gathers PostgreSQL's planner statistics for tables that have none yet (and, with
autovacuum off, for those that have changed enough), instead of waiting for autovacuum."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection

from messaging.jobs import PERIODIC_JOBS
from messaging.services.statistics import planner_statistics_gathered

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's planner statistics"
)


def _sql(statement: str, params: list[object] | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _counts_flushed() -> None:
    """Hand this connection's counts to the statistics collector (PostgreSQL 15 on; before, it
    does so at the end of each transaction) and read them afresh."""
    if connection.pg_version >= 150000:
        _sql("SELECT pg_stat_force_next_flush()")
    _sql("SELECT pg_stat_clear_snapshot()")


def _changes_seen(table: str, at_least: int) -> None:
    """Wait (bounded) until the statistics collector counts `at_least` changes to `table`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _counts_flushed()
        row = _sql("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = %s", [table])
        if row and row[0][0] >= at_least:
            return
        time.sleep(0.1)
    pytest.fail(f"the statistics collector never counted {at_least} changes to {table}")


def _has_statistics(table: str) -> bool:
    return bool(
        _sql("SELECT 1 FROM pg_stats WHERE schemaname = current_schema() AND tablename = %s", [table])
    )


@pytest.fixture
def tables() -> Iterator[list[str]]:
    """Two fresh tables of this test's own, dropped afterwards."""
    names = [f"sb_stats_{uuid.uuid4().hex[:8]}_{i}" for i in range(2)]
    for name in names:
        _sql(f"CREATE TABLE {name} (id integer PRIMARY KEY, pair integer NOT NULL)")
    yield names
    for name in names:
        _sql(f"DROP TABLE IF EXISTS {name}")


def _insert(table: str, start: int, count: int) -> None:
    _sql(
        f"INSERT INTO {table} SELECT g, g %% 7 FROM generate_series(%s::integer, %s::integer) AS g",
        [start, start + count - 1],
    )


@postgresql_only
def test_a_table_without_statistics_gets_them_once_it_has_changed_enough(tables) -> None:
    busy, quiet = tables
    _insert(busy, 1, 200)
    _insert(quiet, 1, 10)  # fewer than autovacuum_analyze_threshold (50)
    _changes_seen(busy, 200)
    _changes_seen(quiet, 10)

    gathered = planner_statistics_gathered(autovacuum=True)

    assert busy in gathered and quiet not in gathered
    assert _has_statistics(busy) and not _has_statistics(quiet)
    _counts_flushed()
    assert busy not in planner_statistics_gathered(autovacuum=True)  # nothing changed since


@postgresql_only
def test_with_autovacuum_on_later_statistics_are_left_to_it_and_with_it_off_gathered_once_a_naptime(
    tables,
) -> None:
    table = tables[0]
    _insert(table, 1, 200)
    _changes_seen(table, 200)
    assert table in planner_statistics_gathered(autovacuum=True)

    _insert(table, 201, 500)  # past 50 + 10% of 200 rows
    _changes_seen(table, 500)

    assert table not in planner_statistics_gathered(autovacuum=True)  # autovacuum's to refresh
    assert table not in planner_statistics_gathered(autovacuum=False, naptime=60)  # not yet again
    assert table in planner_statistics_gathered(autovacuum=False, naptime=0)


@pytest.mark.skipif(connection.vendor == "postgresql", reason="the other databases")
def test_elsewhere_there_is_nothing_to_gather_and_no_job_to_run() -> None:
    assert planner_statistics_gathered() == []
    assert "messaging.tasks.gather_planner_statistics" not in [job.task_name for job in PERIODIC_JOBS]


@postgresql_only
def test_on_postgresql_the_job_runs_every_few_seconds() -> None:
    jobs = {job.task_name: job.every_seconds for job in PERIODIC_JOBS}
    assert jobs["messaging.tasks.gather_planner_statistics"] <= 10
