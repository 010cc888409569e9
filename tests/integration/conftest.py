"""Fixtures for the real-services suite: real PostgreSQL, Redis, daphne, Celery worker and beat.

Nothing here is mocked. The process machinery lives in the `hub_topology` package (the
benchmarks use it too, through `bench/harness.py`); these fixtures scope and clean it up:

- `redis_server` (session): a private redis-server on a free port; flushing or restarting it
  touches nobody else's data (the shared Redis on 6379 is never used by this suite).
- `fresh_database` (function): a factory; each call creates a database `sb_prod_<hex>` on the
  shared PostgreSQL, already migrated (a copy of a template migrated once per run), and returns
  its URL; every database made is dropped at teardown. Pass `migrate=False` to `make_hub` for it.
- `hub` (session): one production topology shared by the tests that only drive it: a fresh
  database, `manage.py migrate`, two daphne web processes, a Celery worker and Celery beat.
  `hub.web_urls[0]` / `[1]` are the two web processes; `hub.register(name, web=i)` registers a
  session through web i; `hub.sql(...)` reads the database for checks afterwards.
- `make_hub` (function): a factory for a topology of your own (`make_hub(database_url=...,
  redis_url=..., webs=2, worker=True, beat=True, extra_env={...})`), for tests that break things;
  stopped at teardown.
- `postgres_cluster` (function): a private PostgreSQL cluster on a free port, which a test may
  stop and start (`.stop("immediate")`, `.start()`); destroyed at teardown.

Every start-up wait is bounded (60 s at most) and every process is stopped at teardown (and at
interpreter exit if a run is interrupted). Mark tests `@pytest.mark.integration`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    Hub,
    PostgresCluster,
    RedisServer,
    database_drop,
    database_migrated,
    hub_start,
)


@pytest.fixture(scope="session")
def prod_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the suite's logs, homes and private servers."""
    return tmp_path_factory.mktemp("sb-prod")


@pytest.fixture(scope="session")
def redis_server(prod_workdir: Path) -> Iterator[RedisServer]:
    """A private Redis for the shared `hub` (never the system Redis)."""
    server = RedisServer(_mkdir(prod_workdir / "redis")).start()
    yield server
    server.stop()


@pytest.fixture
def fresh_database() -> Iterator[Callable[[], str]]:
    """Factory: a new migrated database `sb_prod_<hex>` on the shared PostgreSQL; dropped afterwards."""
    made: list[str] = []

    def _make() -> str:
        url = database_migrated()
        made.append(url)
        return url

    yield _make
    for url in made:
        database_drop(url)


@pytest.fixture(scope="session")
def hub(prod_workdir: Path, redis_server: RedisServer) -> Iterator[Hub]:
    """Two daphne web processes, a Celery worker and beat on a fresh database and a private Redis."""
    url = database_migrated()
    running = None
    try:
        running = hub_start(
            database_url=url,
            redis_url=redis_server.url(),
            workdir=_mkdir(prod_workdir / "hub"),
            migrate=False,
        )
        yield running
    finally:
        if running:
            running.stop()
        database_drop(url)


@pytest.fixture
def make_hub(tmp_path: Path) -> Iterator[Callable[..., Hub]]:
    """Factory for a topology of one's own (see `harness.hub_start`); stopped at teardown."""
    started: list[Hub] = []

    def _make(**kwargs: Any) -> Hub:
        kwargs.setdefault("workdir", _mkdir(tmp_path / f"hub{len(started)}"))
        running = hub_start(**kwargs)
        started.append(running)
        return running

    yield _make
    for running in started:
        running.stop()


@pytest.fixture
def postgres_cluster(tmp_path: Path) -> Iterator[PostgresCluster]:
    """A private PostgreSQL cluster (running) that the test may stop and start; destroyed afterwards."""
    root = Path("/tmp") / f"sb-prod-pg-{tmp_path.name}"  # short path: Unix socket names are limited
    shutil.rmtree(root, ignore_errors=True)
    cluster = PostgresCluster(root).init()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis for one test, which it may flush or restart."""
    server = RedisServer(_mkdir(tmp_path / "redis")).start()
    yield server
    server.stop()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
