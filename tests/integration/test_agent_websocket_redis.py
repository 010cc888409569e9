"""The agent WebSocket on the production footprint (daphne + the Redis channel layer): a socket idle
for longer than redis-py 8's default 5 s socket_timeout still receives the next push."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.integration.harness import Hub

pytestmark = pytest.mark.integration


def test_an_idle_agent_socket_survives_and_gets_the_next_push(
    make_hub: Callable[..., Hub], fresh_database: Callable[[], str], private_redis: Any
) -> None:
    hub = make_hub(
        database_url=fresh_database(), redis_url=private_redis.url(), webs=2, worker=False, beat=False
    )
    bob = hub.register("bob")
    alice = hub.register("alice", web=1)
    ws_url = hub.web_urls[0].replace("http://", "ws://") + "/ws/agent/"

    with connect(ws_url, additional_headers=bob.headers, open_timeout=10) as ws:
        hello = json.loads(ws.recv(timeout=10))
        assert hello["type"] == "hello" and hello["session"]["name"] == "bob"
        time.sleep(6.5)  # longer than redis-py 8's default socket_timeout

        with hub.client(1) as c:  # sent through the other web process: the push crosses Redis
            sent = c.post(
                "/api/v1/messages", json={"to": "bob", "message": "still there?"}, headers=alice.headers
            )
        assert sent.status_code == 201, sent.text
        pushed = json.loads(ws.recv(timeout=15))

        assert pushed["type"] == "messages"
        assert [m["text"] for m in pushed["messages"]] == ["still there?"]
        ws.send(json.dumps({"type": "ack", "ids": [sent.json()["id"]]}))
        acked = json.loads(ws.recv(timeout=10))
        for _ in range(5):  # live events (e.g. the delivery's own state change) may come first
            if acked["type"] == "acked":
                break
            assert acked["type"] == "event", acked
            acked = json.loads(ws.recv(timeout=10))
        assert acked["acked"] == [sent.json()["id"]]
