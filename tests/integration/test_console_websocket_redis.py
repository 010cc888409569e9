"""The operator console's WebSocket on the production footprint (two daphne webs, the Redis layer):
a console logged in on one web process, idle longer than redis-py 8's 5 s socket timeout, is told of
a hold created through the other web process; a foreign origin is refused."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.harness import REPO, VENV_BIN, Hub

pytestmark = pytest.mark.integration
PASSWORD = "console-operator-pw"


def _log_in(hub: Hub, web: int) -> httpx.Client:
    """A browser-like client logged in to the console as `ada` (cookies kept, CSRF token read)."""
    subprocess.run(
        [str(VENV_BIN / "python"), "manage.py", "operator_create", "ada", "--password-stdin"],
        cwd=REPO,
        env=hub.env,
        input=PASSWORD + "\n",
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    client = hub.client(web)
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    done = client.post(
        "/login/", data={"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
    )
    assert done.status_code == 302, done.text[:500]
    return client


def _refused(url: str, headers: dict[str, str]) -> int:
    """Open a socket that must be refused; return the HTTP status of the refusal."""
    try:
        connect(url, additional_headers=headers, open_timeout=10).close()
    except InvalidStatus as exc:
        return exc.response.status_code
    raise AssertionError(f"{url} accepted a socket it should refuse ({headers})")


def test_an_idle_console_socket_hears_a_hold_made_through_another_web(
    make_hub: Callable[..., Hub], fresh_database: Callable[[], str], private_redis: Any
) -> None:
    hub = make_hub(
        database_url=fresh_database(), redis_url=private_redis.url(), webs=2, worker=False, beat=False
    )
    browser = _log_in(hub, web=0)
    alice, bob = hub.register("alice", web=1), hub.register("bob", web=1)
    operator = hub.operator_token()
    with hub.client(1) as c:
        set_policy = c.put(
            f"/api/v1/sessions/{bob.ref}/policy",
            json={"policy": "hold"},
            headers={"Authorization": f"Bearer {operator}"},
        )
        assert set_policy.status_code == 200, set_policy.text

    origin = hub.web_urls[0]
    ws_url = origin.replace("http://", "ws://") + "/ws/console/"
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    with connect(ws_url, additional_headers={"Cookie": cookie, "Origin": origin}, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["kind"] == "hello"
        time.sleep(6.5)  # longer than redis-py 8's default socket_timeout
        with hub.client(1) as c:
            sent = c.post(
                "/api/v1/messages",
                json={"to": "bob", "message": "deploy?"},
                headers={"Authorization": f"Bearer {alice.token}"},
            )
        assert sent.status_code == 201 and sent.json()["status"] == "held", sent.text
        deadline = time.monotonic() + 15
        while True:  # other events (session changes) may come first; bounded by the deadline
            event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if event["kind"] == "message.sent":
                break
        assert event["data"]["message_id"] == sent.json()["id"]
        assert event["data"]["state"] == "held"

    assert _refused(ws_url, {"Cookie": cookie, "Origin": "http://evil.example"}) == 403
    assert _refused(ws_url, {"Origin": origin}) == 403  # no login
    browser.close()
