"""`GET /api/v1/metrics`: operators only, Prometheus' text format, and figures that move as the hub
works (sends, holds, rate-limit refusals, reads, socket writes, open WebSockets, task run time)."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families


def _scrape(api, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = api.client.get("/api/v1/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 200, r.content
    assert r["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(r.content.decode())
        for sample in family.samples
    }


def _value(figures, name: str, **labels: str) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_are_for_operators_only(api, register) -> None:
    alice = register("alice")
    assert api.get("metrics").status_code == 401
    assert api.get("metrics", alice.token).status_code == 403


def test_the_figures_move_as_a_scenario_runs(api, register, send, operator_token, settings) -> None:
    # Given a hub, scraped once
    alice, bob, carol = register("alice"), register("bob"), register("carol")
    before = _scrape(api, operator_token)

    # When alice sends bob three messages, bob reads them, carol's inbound policy holds one, and
    # alice goes over her pair's rate limit to carol
    for i in range(3):
        assert send(alice, "bob", f"hello {i}").status_code == 201
    pulled = api.get("inbox", bob.token).json_body["messages"]
    assert api.post("inbox/ack", bob.token, {"ids": [m["id"] for m in pulled]}).status_code == 200
    assert (
        api.call("PUT", f"sessions/{carol.id}/policy", operator_token, {"policy": "hold"}).status_code == 200
    )
    assert send(alice, "carol", "held one").status_code == 201
    settings.SWITCHBOARD_RATE_PAIR = 1
    refused = send(alice, "carol", "one too many")
    assert refused.status_code == 429 and refused.json_body["reason"] == "pair_rate"
    after = _scrape(api, operator_token)

    # Then the scrape shows each
    assert _value(after, "switchboard_deliveries", kind="text", state="read") == 3
    assert _value(after, "switchboard_holds_pending", reason="operator_policy") == 1
    assert after[("switchboard_hold_oldest_age_seconds", ())] >= 0
    assert (
        _value(after, "switchboard_rate_limit_refusals_total", reason="pair_rate")
        == _value(before, "switchboard_rate_limit_refusals_total", reason="pair_rate") + 1
    )
    for q in ("0.5", "0.9", "0.99"):
        assert _value(after, "switchboard_delivery_latency_seconds", to="read", quantile=q) >= 0
        assert ("switchboard_delivery_latency_seconds", (("quantile", q), ("to", "delivered"))) in after


def test_socket_writes_and_task_run_time_are_counted(api, register, send, operator_token, tmp_path) -> None:
    # Given bob takes messages on a local socket that nobody listens on (every write fails)
    from messaging.models import Delivery
    from messaging.tasks import deliver_to_socket

    alice = register("alice")
    register("bob", peer_address=f"uds:{tmp_path / 'nobody.sock'}")
    before = _scrape(api, operator_token)

    # When alice sends him a message and its socket write runs as a task
    sent = send(alice, "bob", "anyone there?")
    assert sent.status_code == 201
    deliver_to_socket.apply(args=[Delivery.objects.get(message_id=sent.json_body["id"]).pk])
    after = _scrape(api, operator_token)

    # Then the failed write and the task's run time are counted
    failed = sum(
        _value(after, "switchboard_socket_writes_total", outcome=o)
        - _value(before, "switchboard_socket_writes_total", outcome=o)
        for o in ("retry", "left_queued")
    )
    assert failed == 1
    name = "messaging.tasks.deliver_to_socket"
    assert (
        _value(after, "switchboard_task_seconds_count", task=name)
        == _value(before, "switchboard_task_seconds_count", task=name) + 1
    )


def test_forwards_to_other_hubs_are_shown_by_tier_and_state(api, operator_token) -> None:
    from federation.models import RemoteDelivery

    RemoteDelivery.objects.create(
        delivery_id=1,
        message_id="00000000-0000-0000-0000-000000000001",
        tier="lan",
        target="x",
        remote_state="retry",
        attempts=3,
    )
    figures = _scrape(api, operator_token)
    assert _value(figures, "switchboard_forwards", tier="lan", state="retry") == 1
    assert _value(figures, "switchboard_forward_attempts_total", tier="lan") == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_open_agent_websockets_are_counted_while_open() -> None:
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator

    from hub.routing import websocket_application
    from messaging.metrics import OPEN_WEBSOCKETS
    from messaging.services.sessions import session_register

    registered = await sync_to_async(session_register)(name="dana")
    gauge = OPEN_WEBSOCKETS.labels("agent")
    before = gauge._value.get()
    communicator = WebsocketCommunicator(
        websocket_application,
        "/ws/agent/",
        headers=[(b"host", b"127.0.0.1:8765"), (b"authorization", f"Bearer {registered.token}".encode())],
    )
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    assert gauge._value.get() == before + 1
    await communicator.disconnect()
    assert gauge._value.get() == before
    assert re.match(r"^\d", str(before))
