"""The real-services suite's process machinery: the `hub_topology` package (shared with the
benchmarks, which reach it through `bench/harness.py`), under the names the tests import."""

from hub_topology import (
    ENROLL_KEY,
    REPO,
    VENV_BIN,
    Hub,
    PostgresCluster,
    Proc,
    RedisServer,
    Registered,
    database_create,
    database_drop,
    database_migrated,
    free_port,
    hub_start,
    pg_bin,
    rss_mb,
    running_hub,
    wait_until,
)

__all__ = [
    "ENROLL_KEY",
    "REPO",
    "VENV_BIN",
    "Hub",
    "PostgresCluster",
    "Proc",
    "RedisServer",
    "Registered",
    "database_create",
    "database_drop",
    "database_migrated",
    "free_port",
    "hub_start",
    "pg_bin",
    "rss_mb",
    "running_hub",
    "wait_until",
]
