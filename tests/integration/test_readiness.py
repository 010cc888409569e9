"""`/readyz` on a real web process follows its database and Redis: unready while either is down,
ready again once it is back; `/healthz` answers throughout."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.harness import database_create, wait_until

pytestmark = pytest.mark.integration


def _ready(url: str) -> tuple[int, dict]:
    r = httpx.get(f"{url}/readyz", timeout=10)
    return r.status_code, r.json()


def test_readyz_turns_unready_while_postgresql_or_redis_is_down_and_ready_after(
    postgres_cluster, private_redis, make_hub
):
    # Given one web process on a PostgreSQL cluster and a Redis of its own
    hub = make_hub(
        database_url=database_create(postgres_cluster.url()),
        redis_url=private_redis.url(),
        webs=1,
        worker=False,
        beat=False,
    )
    url = hub.web_urls[0]
    assert _ready(url) == (
        200,
        {"status": "ready", "checks": {"database": "ok", "migrations": "ok", "channel_layer": "ok"}},
    )

    # When PostgreSQL stops, the process is unready for its database, and alive
    postgres_cluster.stop("immediate")
    status, body = wait_until(
        lambda: (answer := _ready(url))[0] == 503 and answer, timeout=30, what="/readyz to answer 503"
    )
    assert body["checks"]["database"].startswith("failed")
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    # And once it is back, ready again
    postgres_cluster.start()
    wait_until(lambda: _ready(url)[0] == 200, timeout=60, what="/readyz to answer 200 after PostgreSQL")

    # When Redis stops, unready for the channel layer; ready again when it is back
    private_redis.stop()
    status, body = wait_until(
        lambda: (answer := _ready(url))[0] == 503 and answer, timeout=30, what="/readyz to answer 503"
    )
    assert body["checks"] == {
        "database": "ok",
        "migrations": "ok",
        "channel_layer": "failed: ConnectionError",
    }
    private_redis.start()
    wait_until(lambda: _ready(url)[0] == 200, timeout=60, what="/readyz to answer 200 after Redis")
