"""The benchmarks' harness: hubs to measure, started as real processes and stopped afterwards.

Built on the `hub_topology` package (the process machinery the integration tests use too); the
benchmarks import neither `tests/` nor anything the tests import from here.

- `production_hub`: the production topology (two daphne web processes, a Celery worker and beat)
  on a fresh PostgreSQL database and a private Redis;
- `embedded_hub`: `switchboard serve` with its defaults (one process, SQLite in a fresh home);
- `register`: a session registered through the API, with its token.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from common import progress

from hub_topology import (
    ENROLL_KEY,
    LOAD_ENV,
    REPO,
    VENV_BIN,
    Hub,
    Proc,
    RedisServer,
    Registered,
    database_drop,
    database_migrated,
    free_port,
    hub_start,
    rss_mb,
    wait_until,
)
from hub_topology.embedded import start_hub

__all__ = [
    "ENROLL_KEY",
    "LOAD_ENV",
    "PRODUCTION_SWEEP",
    "REPO",
    "VENV_BIN",
    "Hub",
    "Proc",
    "RedisServer",
    "Registered",
    "database_drop",
    "database_migrated",
    "embedded_hub",
    "free_port",
    "hub_start",
    "production_hub",
    "register",
    "rss_mb",
    "wait_until",
]

# The hub's own sweep interval. The real-services harness shortens it to 1 s so that tests see a
# sweep soon; a benchmark of the production topology runs the production pace (with 1 s, the
# worker and beat run twice the periodic tasks, each a burst of CPU in their processes).
PRODUCTION_SWEEP = {"SWITCHBOARD_SWEEP_SECONDS": "5"}


def register(url: str, name: str, **fields: Any) -> Registered:
    """Register a session `name` through the API of the hub at `url`."""
    r = httpx.post(
        f"{url}/api/v1/sessions",
        json={"name": name, **fields},
        headers={"Authorization": f"Bearer {ENROLL_KEY}"},
        timeout=30,
    )
    r.raise_for_status()
    body = r.json()
    return Registered(id=body["id"], name=body["name"], ref=body["ref"], token=body["token"])


@contextlib.contextmanager
def production_hub(workdir: Path, env: dict[str, str]) -> Iterator[tuple[Hub, str, RedisServer]]:
    """The production topology on a fresh database and a private Redis, stopped afterwards:
    yields the hub, its database URL and its Redis."""
    (workdir / "redis").mkdir(parents=True)
    redis = RedisServer(workdir / "redis").start()
    db = database_migrated()
    hub = None
    try:
        progress("starting the production topology (PostgreSQL database, Redis, 2 daphne, worker, beat)")
        hub = hub_start(
            database_url=db, redis_url=redis.url(), workdir=workdir / "hub", migrate=False, extra_env=env
        )
        yield hub, db, redis
    finally:
        if hub:
            hub.stop()
        redis.stop()
        database_drop(db)


@contextlib.contextmanager
def embedded_hub(workdir: Path, env: dict[str, str]) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    """`switchboard serve` (embedded mode: one process, SQLite) in a fresh home, with `env` on top
    of its defaults, stopped afterwards: yields its URL, its home and its process."""
    home = workdir / "embedded-home"
    home.mkdir(mode=0o700, parents=True)
    progress("starting switchboard serve (embedded mode)")
    hub = start_hub(
        home, extra_env={**env, "SWITCHBOARD_ENROLL_KEY": ENROLL_KEY}, defaults_only=True, timeout=90
    )
    try:
        yield hub.url, home, hub.process
    finally:
        hub.stop()
