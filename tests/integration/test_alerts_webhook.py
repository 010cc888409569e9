"""Operator alerts on the production topology: a daphne web process takes the sends, the Celery
worker posts the alerts (started by the send's escalated hold, and by beat's periodic run), to a
real HTTP listener on 127.0.0.1 standing for the webhook receiver.

One hub, three alerts: an escalated hold (sensitive text), a hold about to expire (the lead time
set so a fresh hold is already within it a few seconds on), and an agent gone silent (the dead
timeout set to seconds). Waits are bounded polls on what the listener received."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hub_fixtures.sensitivity_corpus import AWS_SECRET
from tests.integration.harness import Hub
from tests.teams.hooks import Hook

pytestmark = pytest.mark.integration

SECRET_TEXT = f"creds for the deploy: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} (rotate after)"


@pytest.fixture
def receiver() -> Iterator[Hook]:
    server = Hook().start()
    yield server
    server.stop()


def _alert(receiver: Hook, kind: str, has: str, seconds: float = 30.0) -> dict[str, Any]:
    """The first alert of `kind` whose items name `has`, waiting up to `seconds` for it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for body in list(receiver.received):
            if body.get("kind") == kind and any(has in (i["id"], i["who"]) for i in body["items"]):
                return body
        time.sleep(0.1)
    raise AssertionError(f"no {kind} alert about {has} within {seconds} s; got {receiver.received!r}")


def test_escalated_expiring_and_dead_alerts_reach_a_real_webhook(
    make_hub: Callable[..., Hub], fresh_database: Callable[[], str], private_redis: Any, receiver: Hook
) -> None:
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        webs=1,
        extra_env={
            "SWITCHBOARD_ALERT_WEBHOOK_URL": receiver.url,
            "SWITCHBOARD_ALERT_FORMAT": "json",
            "SWITCHBOARD_ALERT_CONSOLE_URL": "http://console.invalid",
            "SWITCHBOARD_ALERT_SECONDS": "1",
            # Holds last 300 s: with a lead of 294 s, each is "about to expire" ~6 s after it is made.
            "SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS": "294",
            "SWITCHBOARD_DEAD_AFTER_SECONDS": "4",
        },
    )
    alice, bob = hub.register("alice"), hub.register("bob")
    with hub.client(headers=alice.headers) as c:
        sent = c.post("/api/v1/messages", json={"to": bob.id, "message": SECRET_TEXT, "summary": "creds"})
    assert sent.status_code == 201 and sent.json()["status"] == "held", sent.text
    started = time.monotonic()

    escalated = _alert(receiver, "escalated_hold", f"alice [{alice.ref}] → bob [{bob.ref}]", seconds=15)
    [item] = escalated["items"]
    hold = item["id"]
    assert item["why"] == "sensitive: AWS secret access key"
    assert item["url"] == f"http://console.invalid/alerts/holds/{hold}/"
    assert escalated["title"] == "Switchboard: An escalated hold needs an operator"

    expiring = _alert(receiver, "hold_expiring", hold)
    assert time.monotonic() - started >= 4  # not before the hold was within the lead time
    assert expiring["title"] == "Switchboard: A hold expires within 294 s"

    # Nobody heard from alice or bob since they sent and registered: after 4 s both are dead.
    dead = _alert(receiver, "session_dead", f"bob [{bob.ref}] (script)")
    [about_bob] = [i for i in dead["items"] if i["id"] == bob.id]
    assert about_bob["url"] == f"http://console.invalid/alerts/sessions/{bob.id}/"
    assert about_bob["why"].startswith("idle but silent for")

    # Each hold and each silence was told once, whatever the number of periodic runs since.
    time.sleep(3)
    told = [(body["kind"], i["id"]) for body in receiver.received for i in body["items"]]
    assert len(told) == len(set(told)), told
    assert receiver.paths == ["/gate"] * len(receiver.received)
    assert AWS_SECRET not in json.dumps(receiver.received) and "creds" not in json.dumps(receiver.received)
