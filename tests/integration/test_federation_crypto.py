"""What travels between real hub processes on loopback: sealed on the LAN, accepted once.

  A ── LAN ──> tap ──> C      (A is configured with the tap's URL and C's key: `url#key`)
The tap is a loopback TCP relay that keeps every byte A sends C, as an eavesdropper on the LAN
would see them. It then replays what it saw.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.fedhubs import FedHub, hub_key_precreate, start_hub, wait_inbox, wait_state
from tests.integration.harness import free_port

pytestmark = pytest.mark.integration


class Tap:
    """Accepts connections on a loopback port, passes them to `target_port`, and keeps what the
    clients sent (bounded: the first 8 MB)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.seen = bytearray()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.server.settimeout(0.5)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, keep: bool) -> None:
        try:
            while data := src.recv(65536):
                if keep and len(self.seen) < 8 * 1024 * 1024:
                    self.seen.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def request(self, method_path: bytes) -> bytes:
        """The raw bytes of the first request seen for `method_path` (request line, headers, body)."""
        start = bytes(self.seen).index(method_path)
        head_end = bytes(self.seen).index(b"\r\n\r\n", start) + 4
        head = bytes(self.seen[start:head_end])
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        return head + bytes(self.seen[head_end : head_end + length])

    def close(self) -> None:
        self._stop.set()
        self.server.close()


@dataclass
class Pair:
    a: FedHub
    c: FedHub
    tap: Tap
    alice: dict[str, Any]
    carol: dict[str, Any]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("fed-crypto")
    started: list[FedHub] = []
    tap = None
    try:
        c_port = free_port()
        c_key = hub_key_precreate(work / "hub-c")
        tap = Tap(c_port)
        c = start_hub("hub-c", work, registry=work / "registry-c", port=c_port)
        started.append(c)
        a = start_hub(
            "hub-a", work, registry=work / "registry-a", lan=[f"http://127.0.0.1:{tap.port}#{c_key}"]
        )
        started.append(a)
        c.pin(a.public_key(), name="hub-a", tier="lan")  # C vouches for A: its messages are not held
        yield Pair(a, c, tap, a.register("alice"), c.register("carol"))
    finally:
        for hub in reversed(started):
            hub.server.stop()
        if tap is not None:
            tap.close()


def test_a_lan_forward_is_sealed_on_the_wire_and_a_replay_of_it_is_refused(pair):
    secret = f"lan-secret-{uuid.uuid4().hex}"
    sent = pair.a.send(pair.alice, "carol", secret, summary="summary-secret")
    assert sent.status_code == 201, sent.text
    [frame] = wait_inbox(pair.c, pair.carol)
    assert frame["text"] == secret and frame["trust"] == "lan-verified"
    wait_state(pair.a, pair.alice, sent.json()["id"], "delivered")
    assert b"/api/v1/federation/messages" in pair.tap.seen  # the forward went through the tap
    assert secret.encode() not in pair.tap.seen
    assert b"summary-secret" not in pair.tap.seen

    # The eavesdropper sends the captured forward again, byte for byte, straight to C.
    captured = pair.tap.request(b"POST /api/v1/federation/messages")
    with socket.create_connection(("127.0.0.1", int(pair.c.url.rsplit(":", 1)[1])), timeout=10) as conn:
        conn.sendall(captured)
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
    assert b"replayed_request" in answer
    assert pair.c.inbox(pair.carol) == []
