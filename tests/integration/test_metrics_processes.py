"""Metrics on the production topology: the web process's `/api/v1/metrics` (operators) and the
worker's own port move as a scenario runs; pool processes are added up in multiprocess mode."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import free_port, wait_until
from tests.integration.ledger import LOAD_ENV, Ledger, SocketReceiver, WebSocketAgent, socket_path

pytestmark = pytest.mark.integration


def _figures(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_web_and_worker_metrics_move_as_a_scenario_runs(private_redis, fresh_database, make_hub, tmp_path):
    # Given one web process and a worker (two pool processes) that serves its metrics on a port,
    # sharing a multiprocess folder
    port = free_port()
    folder = tmp_path / "metrics"
    folder.mkdir()
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        migrate=False,
        webs=1,
        beat=False,
        extra_env={
            **LOAD_ENV,
            "SWITCHBOARD_WORKER_METRICS_PORT": str(port),
            "PROMETHEUS_MULTIPROC_DIR": str(folder),
        },
    )
    operator = {"Authorization": f"Bearer {hub.operator_token()}"}
    ledger = Ledger()
    receiver = SocketReceiver(socket_path("sbm"), ledger)
    receiver.start()
    alice = hub.register("alice-metrics")
    bob = hub.register("bob-metrics", peer_address=receiver.address)
    carol = hub.register("carol-metrics")
    socket_agent = WebSocketAgent(hub.web_urls[0], carol, ledger)
    socket_agent.start()
    try:
        assert socket_agent.ready.wait(20)

        # When alice sends bob five messages, which the worker writes to his socket
        with hub.client(headers=alice.headers) as c:
            for i in range(5):
                assert c.post("/api/v1/messages", json={"to": bob.ref, "message": f"m{i}"}).status_code == 201
        wait_until(lambda: len(ledger.received) == 5, timeout=60, what="five socket writes")

        # Then the web process's scrape shows the deliveries and carol's open socket
        with hub.client() as c:
            assert c.get("/api/v1/metrics").status_code == 401
            web = _figures(c.get("/api/v1/metrics", headers=operator).text)
        delivered = web.get(("switchboard_deliveries", (("kind", "text"), ("state", "delivered"))), 0)
        read = web.get(("switchboard_deliveries", (("kind", "text"), ("state", "read"))), 0)
        assert delivered + read == 5
        assert web[("switchboard_open_websockets", (("kind", "agent"),))] == 1
        # And the worker's port shows the writes and the task run times of its pool processes
        worker = wait_until(
            lambda: (
                (f := _figures(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)).get(
                    ("switchboard_socket_writes_total", (("outcome", "delivered"),)), 0
                )
                == 5
                and f
            ),
            timeout=30,
            what="the worker's metrics to count five writes",
        )
        assert (
            worker[("switchboard_task_seconds_count", (("task", "messaging.tasks.deliver_to_socket"),))] == 5
        )
    finally:
        socket_agent.stop()
        receiver.stop()
