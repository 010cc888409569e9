"""Federation with a production-footprint hub: PostgreSQL, a private Redis, daphne, a Celery
worker and Celery beat (receipts and retries run as Celery tasks; a forward is handed over by the
web process before the send is answered), talking over the LAN tier to an embedded hub (one
process, SQLite)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.fedhubs import ENROLL, FedHub, hub_key_precreate, start_hub, wait_inbox
from tests.integration.harness import Hub, free_port, hub_start, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hub, FedHub]]:
    from tests.integration.harness import RedisServer, database_drop, database_migrated

    work = tmp_path_factory.mktemp("fed-prod")
    redis = RedisServer(work).start()
    db_url = database_migrated()
    port = free_port()
    prod_url = f"http://127.0.0.1:{port}"
    embedded = None
    prod = None
    try:
        # Each hub is configured with the other's URL and key (what it seals forwards to).
        prod_key = hub_key_precreate(work / "prod" / "home")
        embedded_key = hub_key_precreate(work / "embedded")
        embedded = start_hub("embedded", work, registry=work / "registry-e", lan=[f"{prod_url}#{prod_key}"])
        prod = hub_start(
            database_url=db_url,
            redis_url=redis.url(),
            workdir=work / "prod",
            webs=0,
            migrate=False,
            extra_env={
                "SWITCHBOARD_PUBLIC_URL": prod_url,
                "SWITCHBOARD_HUB_NAME": "prod",
                "SWITCHBOARD_LAN_PEERS": f"{embedded.url}#{embedded_key}",
                "SWITCHBOARD_FEDERATION_POLL_SECONDS": "0.5",
                "SWITCHBOARD_HOSTS_CACHE_SECONDS": "1",
            },
        )
        prod.start_web(port=port)
        yield prod, embedded
    finally:
        if prod is not None:
            prod.stop()
        if embedded is not None:
            embedded.server.stop()
        redis.stop()
        database_drop(db_url)


def _prod(prod: Hub, method: str, path: str, token: str, body: Any = None) -> httpx.Response:
    return httpx.request(
        method,
        f"{prod.web_urls[0]}/api/v1/{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_forwards_go_over_receipts_come_back_and_replies_reach_the_production_hub(pair):
    prod, embedded = pair
    alice = prod.register("alice")
    erin = embedded.call("POST", "sessions", ENROLL, {"name": "erin"}).json()

    sent = _prod(prod, "POST", "messages", alice.token, {"to": "erin", "message": "from production"})
    assert sent.status_code == 201, sent.text
    assert sent.json()["status"] == "relayed", sent.json()
    message_id = sent.json()["id"]
    # Handed to the embedded hub by the web process before alice was answered, not left to a job.
    [delivery] = _prod(prod, "GET", f"messages/{message_id}", alice.token).json()["deliveries"]
    assert delivery["remote"]["remote_state"] not in ("pending", "retry"), delivery
    [frame] = wait_inbox(embedded, erin, timeout=30)
    assert frame["text"] == "from production" and frame["trust"] == "lan-verified"

    embedded.call("POST", "inbox/ack", erin["token"], {"ids": [message_id]})
    wait_until(
        lambda: _prod(prod, "GET", f"messages/{message_id}", alice.token).json()["status"] == "read",
        timeout=30,
        what="the read receipt at the production hub",
        interval=0.3,
    )

    reply = embedded.send(erin, "alice", "from embedded")
    assert reply.status_code == 201, reply.text
    got = wait_until(
        lambda: _prod(prod, "GET", "inbox", alice.token).json()["messages"],
        timeout=30,
        what="the reply in alice's inbox",
        interval=0.3,
    )
    assert got[0]["text"] == "from embedded" and got[0]["delivery_tier"] == "lan"
