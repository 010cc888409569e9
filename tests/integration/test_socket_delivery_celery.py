"""Local socket inbox in the production footprint: PostgreSQL, Redis, daphne, a real Celery worker
and beat, and a real Unix socket on the test's side."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from switchboard_agent.listen import bind_socket, read_frame, serve
from tests.integration.harness import Hub, Registered, wait_until

pytestmark = pytest.mark.integration
SOCKET_ENV = {"SWITCHBOARD_SOCKET_TIMEOUT": "1", "SWITCHBOARD_SOCKET_RETRY_SECONDS": "1"}


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sbi-", dir="/tmp"))  # AF_UNIX paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def socket_hub(make_hub: Callable[..., Hub], fresh_database: Callable[[], str], private_redis: Any) -> Hub:
    """One web process, a worker and beat on a fresh database and a private Redis."""
    return make_hub(
        database_url=fresh_database(), redis_url=private_redis.url(), webs=1, extra_env=SOCKET_ENV
    )


class Listener:
    """`switchboard listen` in a thread, for the session `session_id`."""

    def __init__(self, path: Path, session_id: str) -> None:
        self.frames: list[dict[str, Any]] = []
        self.server = bind_socket(str(path))
        self.thread = threading.Thread(
            target=serve,
            args=(self.server, self.frames.append),
            kwargs={"session_id": session_id, "count": 1, "seconds": 90},
            daemon=True,
        )
        self.thread.start()

    def close(self) -> None:
        self.thread.join(timeout=5)
        self.server.close()


def send(hub: Hub, sender: Registered, to: str, text: str) -> str:
    with hub.client() as c:
        r = c.post("/api/v1/messages", json={"to": to, "message": text}, headers=sender.headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def delivery(hub: Hub, message_id: str) -> dict[str, Any]:
    [(state, attempts, last_error, pk)] = hub.sql(
        "SELECT state, attempts, last_error, id FROM messaging_delivery WHERE message_id = %s", message_id
    )
    return {"state": state, "attempts": attempts, "last_error": last_error, "id": pk}


def test_a_worker_writes_the_frame_and_the_delivery_becomes_delivered(
    socket_hub: Hub, sock_dir: Path
) -> None:
    path = sock_dir / "bob.sock"
    bob = socket_hub.register("bob", peer_address=f"uds:{path}")
    listener = Listener(path, bob.id)
    alice = socket_hub.register("alice")

    message_id = send(socket_hub, alice, "bob", "from a real worker")

    wait_until(lambda: delivery(socket_hub, message_id)["state"] == "delivered", timeout=60, what="delivered")
    listener.close()
    assert [f["text"] for f in listener.frames] == ["from a real worker"]
    assert delivery(socket_hub, message_id)["attempts"] == 1


def test_a_receiver_that_never_reads_leaves_the_message_queued_and_pullable(
    socket_hub: Hub, sock_dir
) -> None:
    path = sock_dir / "stuck.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(str(path))
    stuck.listen(8)  # connections queue in the backlog; nobody ever reads them
    try:
        bob = socket_hub.register("bob", peer_address=f"uds:{path}")
        message_id = send(socket_hub, socket_hub.register("alice"), "bob", "anyone home?")
        wait_until(lambda: delivery(socket_hub, message_id)["attempts"] >= 2, timeout=60, what="two attempts")
        # Read it while the receiver still exists: closing it ends the attempt in flight with a
        # "connection reset" instead of the timeout the first attempt recorded.
        found = delivery(socket_hub, message_id)
    finally:
        stuck.close()

    assert found["state"] == "queued"
    assert "did not take the frame" in found["last_error"]
    # A pull skips a row another transaction holds (SKIP LOCKED): the attempt that closing the
    # receiver ended may be recording its failure at this moment, so the message comes with a pull
    # once that commits.
    with socket_hub.client() as c:
        pulled = wait_until(
            lambda: c.get("/api/v1/inbox", headers=bob.headers).json()["messages"],
            timeout=10,
            what="a pull to hand over the queued message",
        )
    assert [m["id"] for m in pulled] == [message_id]


def test_a_worker_killed_mid_delivery_still_delivers_exactly_once(socket_hub: Hub, sock_dir: Path) -> None:
    path = sock_dir / "bob.sock"
    got_frame = threading.Event()
    server = bind_socket(str(path))

    def take_but_never_ack() -> None:  # the worker dies while waiting for this ack
        conn, _ = server.accept()
        with conn:
            if read_frame(conn) is not None:
                got_frame.set()
            got_frame.wait(60)

    holder = threading.Thread(target=take_but_never_ack, daemon=True)
    holder.start()
    bob = socket_hub.register("bob", peer_address=f"uds:{path}")
    message_id = send(socket_hub, socket_hub.register("alice"), "bob", "survive a crash")
    assert got_frame.wait(60), "the worker never wrote the frame"

    assert socket_hub.worker is not None
    socket_hub.worker.kill()  # SIGKILL mid-delivery: no ack, no state change
    assert delivery(socket_hub, message_id)["state"] == "queued"
    holder.join(timeout=5)
    server.close()
    path.unlink()
    listener = Listener(path, bob.id)
    socket_hub.start_worker()  # the lease runs out, beat re-enqueues, the new worker takes it over

    wait_until(
        lambda: delivery(socket_hub, message_id)["state"] == "delivered", timeout=90, what="re-delivery"
    )
    listener.close()
    found = delivery(socket_hub, message_id)
    assert found["attempts"] >= 2
    delivered_events = socket_hub.sql(
        "SELECT count(*) FROM messaging_auditevent WHERE kind = 'delivery.delivered' AND delivery_id = %s",
        found["id"],
    )
    assert delivered_events == [(1,)]
    assert [f["text"] for f in listener.frames] == ["survive a crash"]
