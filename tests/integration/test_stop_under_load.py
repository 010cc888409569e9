"""Stopping each process under load: it exits within seconds of SIGTERM (or Ctrl-C), and every
send it answered is in the database afterwards (what it had not answered may be lost to the
client, never half-written)."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from hub_topology.embedded import start_hub
from tests.integration.harness import wait_until
from tests.integration.ledger import LOAD_ENV, Ledger, SendLoad, SocketReceiver, ledger_problems, socket_path

pytestmark = pytest.mark.integration

SENDERS = 16
STOP_WITHIN_SECONDS = 10


def _register(client: httpx.Client, key: str, name: str, **fields: object) -> dict:
    r = client.post(
        "/api/v1/sessions", json={"name": name, **fields}, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 201, r.text
    return r.json()


def _stop_and_time(process, sig: int, *, what: str) -> float:
    """Send `sig` and wait for the process to exit; the seconds it took (fails past the bound)."""
    started = time.monotonic()
    process.send_signal(sig)
    try:
        process.wait(timeout=STOP_WITHIN_SECONDS * 3)
    except Exception:
        process.kill()
        raise AssertionError(
            f"the process did not exit within {STOP_WITHIN_SECONDS * 3} s of {sig!r}"
        ) from None
    return time.monotonic() - started


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_serve_stops_within_seconds_under_load_and_keeps_every_answered_send(tmp_path: Path, sig: int):
    # Given `switchboard serve` on the embedded defaults, 16 senders each sending to their own
    # recipient as fast as the hub answers
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    hub = start_hub(home, extra_env=LOAD_ENV)
    try:
        with httpx.Client(base_url=hub.url, timeout=30) as c:
            pairs = [
                (_register(c, hub.enroll_key, f"sender{i}"), _register(c, hub.enroll_key, f"recipient{i}"))
                for i in range(SENDERS)
            ]
        answered: list[str] = []
        lock = threading.Lock()
        halt = threading.Event()

        def send(sender: dict, recipient: dict) -> None:
            headers = {"Authorization": f"Bearer {sender['token']}"}
            with httpx.Client(base_url=hub.url, headers=headers, timeout=30) as c:
                for i in range(100_000):
                    if halt.is_set():
                        return
                    try:
                        r = c.post("/api/v1/messages", json={"to": recipient["ref"], "message": f"load #{i}"})
                    except httpx.HTTPError:
                        return  # the hub stopped under this request: not answered, so not promised
                    if r.status_code == 201:
                        with lock:
                            answered.append(r.json()["id"])

        threads = [threading.Thread(target=send, args=pair, daemon=True) for pair in pairs]
        for t in threads:
            t.start()
        wait_until(lambda: len(answered) >= 200, timeout=60, what="200 answered sends")

        # When the hub is told to stop while the sends go on
        took = _stop_and_time(hub.process, sig, what="serve")
        halt.set()
        for t in threads:
            t.join(timeout=10)
    finally:
        hub.stop(signal.SIGKILL)

    # Then it exited cleanly within seconds
    assert hub.process.returncode == 0, hub.log.read_text()[-3000:]
    assert took < STOP_WITHIN_SECONDS, f"took {took:.1f} s to stop"
    # And every send it answered is in the database, with its delivery
    with sqlite3.connect(home / "switchboard.sqlite3") as db:
        stored = {
            uuid.UUID(m)
            for (m,) in db.execute(
                "SELECT m.id FROM messaging_message m JOIN messaging_delivery d ON d.message_id = m.id"
            )
        }
    missing = [m for m in answered if uuid.UUID(m) not in stored]
    assert answered and missing == [], f"{len(missing)} of {len(answered)} answered sends are missing"


def test_web_and_worker_stop_within_seconds_under_load_and_lose_nothing(
    private_redis, fresh_database, make_hub, tmp_path: Path
):
    # Given the production topology with two web processes, a worker and beat; alice sends to bob
    # through web 0 and carol to dave (who takes messages on a local socket, by Celery tasks)
    # through web 1
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        migrate=False,
        extra_env={**LOAD_ENV, "SWITCHBOARD_SOCKET_TIMEOUT": "2"},
    )
    ledger = Ledger()
    receiver = SocketReceiver(socket_path("sbs"), ledger)
    receiver.start()
    alice, bob = hub.register("alice-stop", web=0), hub.register("bob-stop", web=0)
    carol = hub.register("carol-stop", web=1)
    dave = hub.register("dave-stop", web=1, peer_address=receiver.address)
    to_bob = [SendLoad(hub.web_urls[0], alice, bob.ref, ledger, count=100_000, tag=f"a{i}") for i in range(8)]
    to_dave = SendLoad(hub.web_urls[1], carol, dave.ref, ledger, count=100_000, interval=0.005)
    for s in [*to_bob, to_dave]:
        s.start()
    try:
        wait_until(lambda: len(ledger.accepted) >= 200, timeout=60, what="200 accepted sends")

        # When web 0 is told to stop while sends go through it
        web_took = _stop_and_time(hub.webs[0].popen, signal.SIGTERM, what="web 0")
        # And the worker is told to stop while socket writes are queued for it
        worker_took = _stop_and_time(hub.worker.popen, signal.SIGTERM, what="the worker")
        for s in [*to_bob, to_dave]:
            s.halt.set()
            s.join(timeout=30)

        # Then each exited within seconds, the worker by its warm shutdown
        assert web_took < STOP_WITHIN_SECONDS, f"web took {web_took:.1f} s to stop"
        assert worker_took < STOP_WITHIN_SECONDS, f"worker took {worker_took:.1f} s to stop"
        assert "Warm shutdown" in hub.worker.log() or "warm shutdown" in hub.worker.log().lower()
        # And once a worker runs again, every accepted message to dave reaches his socket
        hub.start_worker()
        to_dave_ids = [m for m, info in ledger.accepted.items() if info["key"].startswith("carol")]
        wait_until(
            lambda: all(ledger.received[m] for m in to_dave_ids),
            timeout=120,
            what="every accepted message to dave to reach his socket after the worker restarted",
        )
    finally:
        receiver.stop()
    # And the books agree: every send answered 2xx exists, with one delivery and an unbroken audit
    problems = ledger_problems(hub, ledger, end_states={"queued", "delivered"}, expect_received=False)
    assert problems == []
