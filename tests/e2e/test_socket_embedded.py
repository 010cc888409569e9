"""Local socket inbox in the embedded footprint: a real `switchboard serve` (SQLite, background jobs
on its in-process pool, retries from its in-process scheduler) writing to a real Unix socket."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hub_topology.embedded import Hub, start_hub
from switchboard_agent.listen import bind_socket, serve

pytestmark = pytest.mark.e2e


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sbe-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fast_hub(tmp_path: Path) -> Iterator[Hub]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    running = start_hub(
        home, extra_env={"SWITCHBOARD_SOCKET_TIMEOUT": "1", "SWITCHBOARD_SOCKET_RETRY_SECONDS": "1"}
    )
    yield running
    running.stop()


def register(hub: Hub, name: str, **fields: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{hub.url}/api/v1/sessions",
        json={"name": name, **fields},
        headers={"Authorization": f"Bearer {hub.enroll_key}"},
    )
    assert r.status_code == 201, r.text
    return r.json()


def status(hub: Hub, sender: dict[str, Any], message_id: str) -> str:
    r = httpx.get(
        f"{hub.url}/api/v1/messages/{message_id}", headers={"Authorization": f"Bearer {sender['token']}"}
    )
    return r.json()["status"]


def wait_for_status(
    hub: Hub, sender: dict[str, Any], message_id: str, wanted: str, timeout: float = 30
) -> str:
    deadline = time.monotonic() + timeout
    found = status(hub, sender, message_id)
    while found != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
        found = status(hub, sender, message_id)
    return found


def test_the_embedded_hub_writes_to_the_socket_and_retries_a_late_listener(
    fast_hub: Hub, sock_dir: Path
) -> None:
    path = sock_dir / "bob.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(str(path))
    stuck.listen(8)  # at first a receiver that never reads
    bob = register(fast_hub, "bob", peer_address=f"uds:{path}")
    alice = register(fast_hub, "alice")
    sent = httpx.post(
        f"{fast_hub.url}/api/v1/messages",
        json={"to": "bob", "message": "held up by a stuck receiver"},
        headers={"Authorization": f"Bearer {alice['token']}"},
    )
    assert sent.status_code == 201
    message_id = sent.json()["id"]
    time.sleep(2.5)  # the first write times out (1 s); the message stays queued
    assert status(fast_hub, alice, message_id) == "queued"

    stuck.close()
    path.unlink()
    frames: list[dict[str, Any]] = []
    server = bind_socket(str(path))
    taker = threading.Thread(
        target=serve,
        args=(server, frames.append),
        kwargs={"session_id": bob["id"], "count": 1, "seconds": 30},
    )
    taker.start()

    assert wait_for_status(fast_hub, alice, message_id, "delivered") == "delivered"  # a scheduled retry
    taker.join(timeout=10)
    server.close()
    assert [f["text"] for f in frames] == ["held up by a stuck receiver"]
