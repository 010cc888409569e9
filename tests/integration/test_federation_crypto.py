"""What travels between real hub processes on loopback: sealed on the LAN, accepted once, and
answered only in the words of the hub it was sent to.

  A ── LAN ──> tap ──> C      (A is configured with the tap's URL and C's key: `url#key`)
The tap is a loopback TCP relay that keeps every byte A sends C, as an eavesdropper on the LAN
would see them. It then replays what it saw, and rewrites C's answers as someone on the path could.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.fedhubs import FedHub, hub_key_precreate, start_hub, wait_inbox, wait_state
from tests.integration.harness import free_port, wait_until

pytestmark = pytest.mark.integration


class Tap:
    """Accepts connections on a loopback port, passes them to `target_port`, and keeps what the
    clients sent (bounded: the first 8 MB). While `rewrite` is set, each answer coming back is
    read whole and what it returns (from the answer's head and body) is sent instead."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.seen = bytearray()
        self.rewrite: Callable[[bytes, bytes], bytes] | None = None
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
            answers = self._pipe if self.rewrite is None else self._rewritten
            threading.Thread(target=answers, args=(upstream, client, False), daemon=True).start()

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

    def _rewritten(self, src: socket.socket, dst: socket.socket, keep: bool) -> None:
        """One answer (head and a Content-Length body) read whole from `src`, rewritten, then the
        rest passed on as it comes (hubs call with one request per connection)."""
        rewrite = self.rewrite
        answer = b""
        try:
            while b"\r\n\r\n" not in answer and (data := src.recv(65536)):
                answer += data
            head, _, body = answer.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            while len(body) < length and (data := src.recv(65536)):
                body += data
            dst.sendall(rewrite(head, body) if rewrite is not None else answer)
        except (OSError, AttributeError, ValueError):
            pass
        self._pipe(src, dst, keep)

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


def _forward_answer_as_read(head: bytes, body: bytes) -> bytes:
    """C's own answer to a forward (it names the trust C gave the message), its body changed to
    say `read`, under C's signature; any other answer (a lookup's) as it came."""
    if b'"trust"' not in body:
        return head + b"\r\n\r\n" + body
    forged = re.sub(rb'"status": ?"[a-z_]+"', b'"status": "read"', body)
    head = re.sub(rb"(?i)content-length:\s*\d+", b"content-length: %d" % len(forged), head)
    return head + b"\r\n\r\n" + forged


def test_cs_answer_changed_on_the_wire_is_no_answer_and_cs_own_is_taken(pair):
    """Someone on the path rewrites C's answer to A's forward to say `read` (keeping C's answer
    signature): A takes it as no answer (its delivery stays `relayed`, never `read`; the forward is
    retried, and A's audit has it). Once answers come through unchanged, A's retry takes C's own
    answer (the message there, once), and C's receipts move A's delivery on."""
    pair.tap.rewrite = _forward_answer_as_read
    try:
        sent = pair.a.send(pair.alice, "carol", "answered on the wire")
        assert sent.status_code == 201, sent.text
        assert sent.json()["status"] == "relayed", sent.json()
        [delivery] = pair.a.status(pair.alice, sent.json()["id"])["deliveries"]
        assert delivery["state"] == "relayed" and delivery["remote"]["remote_state"] == "retry", delivery
        assert "counts as no answer" in delivery["remote"]["last_error"]
        with contextlib.closing(pair.a.db()) as db:
            refused = db.execute(
                "SELECT detail FROM messaging_auditevent WHERE kind = 'federation.answer_refused'"
            ).fetchall()
        assert refused and "does not verify" in refused[0][0], refused
    finally:
        pair.tap.rewrite = None

    seen: list[str] = []

    def answered() -> bool:
        [delivery] = pair.a.status(pair.alice, sent.json()["id"])["deliveries"]
        seen.append(delivery["state"])
        return delivery["remote"]["remote_state"] == "queued"

    wait_until(answered, timeout=30, what="A's retry answered by C", interval=0.2)
    assert set(seen) == {"relayed"}, seen
    frames = wait_inbox(pair.c, pair.carol)
    assert [f["text"] for f in frames].count("answered on the wire") == 1
    wait_state(pair.a, pair.alice, sent.json()["id"], "delivered")
