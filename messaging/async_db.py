"""PostgreSQL from the server's event loop: a small pool of asyncio psycopg connections.

A WebSocket push pulls the recipient's queued messages as soon as the `inbox.queued` event
arrives. Through Django's (synchronous) connection, that pull hops to a thread of the server's
pool and back, and takes a connection from Django's pool and gives it back. With this pool the
pull's one statement is awaited on the loop itself, without blocking the other sockets: on an idle
hub the pull took 1.00-1.19 ms (p50) where through a thread it took 1.16-1.39 ms
(docs/performance.md, thirteenth round).

It connects as Django's `default` database does (same settings, the same type adapters, so rows
load into the same Python values), in autocommit, preparing a statement the second time a
connection runs it. Only for PostgreSQL: `available()` says whether it applies.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from django.conf import settings
from django.db import connections

# How long a pull waits for a connection before it fails (and its socket closes; the agent
# reconnects and pulls). Under load pulls queue here, behind the pool's connections, as they did
# behind the threads of the server's pool: waiting is the normal case, not a fault.
WAIT_SECONDS = 30.0

_pools: dict[tuple[int, int], Any] = {}  # (process id, id of the event loop) → its pool
_opening: dict[tuple[int, int], asyncio.Lock] = {}


def available() -> bool:
    """Whether the default database is PostgreSQL (else callers take Django's connection)."""
    return connections["default"].vendor == "postgresql"


def _connection_kwargs() -> dict[str, Any]:
    """What Django passes psycopg for the default database, less what only its own wrapper takes."""
    wrapper = connections["default"]
    params = wrapper.get_connection_params()
    params.pop("cursor_factory", None)  # Django's are synchronous; the asyncio default binds server-side
    params["autocommit"] = True
    params.setdefault("prepare_threshold", 2)
    return params


def _key() -> tuple[int, int]:
    return os.getpid(), id(asyncio.get_running_loop())


async def _pool() -> Any:
    """This loop's pool, opened on first use (a forked child, or another loop, gets its own)."""
    key = _key()
    pool = _pools.get(key)
    if pool is not None:
        return pool
    lock = _opening.setdefault(key, asyncio.Lock())
    async with lock:
        pool = _pools.get(key)
        if pool is None:
            from psycopg_pool import AsyncConnectionPool

            pool = AsyncConnectionPool(
                kwargs=_connection_kwargs(),
                min_size=1,
                max_size=max(1, settings.SWITCHBOARD_PUSH_DB_POOL),
                timeout=WAIT_SECONDS,
                max_idle=60,
                open=False,
                name="switchboard-push",
            )
            await pool.open()
            _pools[key] = pool
    return pool


@asynccontextmanager
async def cursor() -> AsyncIterator[Any]:
    """An asyncio cursor on a pooled connection (autocommit: each statement commits alone)."""
    pool = await _pool()
    async with pool.connection() as conn, conn.cursor() as cur:
        yield cur


async def close_pools() -> None:
    """Close this process's pools (tests that start and stop loops)."""
    for key in [k for k in _pools if k[0] == os.getpid()]:
        pool = _pools.pop(key)
        _opening.pop(key, None)
        await pool.close()
