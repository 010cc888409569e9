"""The Redis server the fast suite's Redis tests use: REDIS_URL's, else the standard local one."""

from __future__ import annotations

import os

import pytest


def local_redis_url() -> str:
    """REDIS_URL (or TEST_REDIS_URL, or the standard local port's database 0), once it answers a
    ping; the calling test is skipped when nothing answers."""
    import redis

    url = os.environ.get("REDIS_URL") or os.environ.get("TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except Exception:
        pytest.skip("no Redis on the standard local port")
    return url
