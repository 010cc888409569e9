"""What a relay (or another hub) can make this hub take in with one answer. The relay bounds what
it gives (bytes and items per pull), but a hub cannot rest on that: whoever runs the relay, or
answers at its URL over plain HTTP, chooses the answer. So this hub reads at most what a hub body
may carry, and takes from one pull answer no more items, and no more lease names, than a relay
gives and than it asked about."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from tests.federation.conftest import OtherHub, federation_isolated

CAP = 64 * 1024  # the answer cap for these tests (the real one is MAX_HUB_BODY, 280 MB)
SENT = 1024 * 1024  # what the hostile answer would carry


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    federation_isolated(settings, tmp_path)


class _Flood(BaseHTTPRequestHandler):
    """Answers every request with SENT bytes of one JSON string, declared or chunked."""

    declared = True
    written = 0

    def _answer(self) -> None:
        body = b'{"messages": "' + b"x" * (SENT - 16) + b'"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.declared:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for start in range(0, len(body), 16 * 1024):
                chunk = body[start : start + 16 * 1024]
                if self.declared:
                    self.wfile.write(chunk)
                else:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                type(self).written += len(chunk)
            if not self.declared:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flood() -> Iterator[tuple[str, type[_Flood]]]:
    """A hostile relay on loopback that answers with far more than any answer may carry."""
    handler = type("Flood", (_Flood,), {"written": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_answer_larger_than_a_hub_body_is_not_read_whole(
    db: None, flood: tuple[str, type[_Flood]], monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    """A relay answers a pull with more than any answer may carry (declared, or chunked with no
    length): the call fails as the relay not answering (transient), without taking it all in."""
    from federation import transport
    from federation.errors import TransientError

    url, handler = flood
    handler.declared = declared
    monkeypatch.setattr(transport, "MAX_HUB_BODY", CAP)
    dest = OtherHub(SigningKey.generate()).public_key

    with pytest.raises(TransientError, match="larger than"):
        transport.hub_call("POST", url, "/relay/pull", {"agents": []}, dest_key=dest, timeout=10)


def test_one_pull_answer_gives_no_more_items_and_lease_names_than_a_relay_gives(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay answers a pull with more messages than a relay hands out at once, and a refusal
    for thousands of names this hub never asked about: the hub handles as many messages as a
    relay gives in one answer, and hears about the lease of its own agents' names only."""
    from federation.services.relay import MESSAGES_PER_PULL, relay_pull_once
    from messaging.models import AuditEvent

    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key
    junk = [
        {"id": str(uuid.uuid4()), "message_id": str(uuid.uuid4()), "from_hub": "x", "sealed": "not base64!"}
        for _ in range(MESSAGES_PER_PULL + 30)
    ]
    leases = {f"name-{i}": "held_elsewhere" for i in range(2000)} | {"ops": "held_elsewhere"}
    finished: list[dict[str, Any]] = []

    def relay_answers(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        if path == "/relay/pull":
            return {"leases": leases, "messages": junk, "receipts": [], "more": False}
        finished.append(body)
        return {}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)

    counts = relay_pull_once(sessions=[{"name": "ops"}])

    assert counts["released"] == MESSAGES_PER_PULL
    assert len(finished[0]["release"]) == MESSAGES_PER_PULL
    refused = AuditEvent.objects.filter(kind="relay.lease_refused").values_list("target", flat=True)
    assert list(refused) == ["ops"]


def test_junk_receipt_batches_through_the_relay_are_audited_once_per_relay(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any key may store receipt batches at the relay for this hub, and a relay may make up its
    own: batches sealed to this hub, each naming another key made at home, signed for another hub
    or by another key, pull after pull. Each is refused, and the refusals are audited once for
    the relay (`federation.receipt_rejected`, once per relay per 10 minutes), not once a batch."""
    from federation.services.forwarding import seal_for_hub
    from federation.services.identity import hub_identity
    from federation.services.relay import RECEIPTS_PER_PULL, relay_pull_once
    from federation.services.signatures import receipt_batch_sign
    from messaging.models import AuditEvent

    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key
    here = hub_identity().public_key
    offered: list[str] = []

    def junk(n: int) -> dict[str, Any]:
        key = SigningKey.generate()
        receipts = [{"message_id": str(uuid.uuid4()), "state": "read"}]
        if n % 2:
            batch = receipt_batch_sign(receipts=receipts, dest_key=OtherHub(key).public_key, key=key)
        else:
            batch = receipt_batch_sign(receipts=receipts, dest_key=here, key=key)
            batch["hub"] = OtherHub(SigningKey.generate()).public_key
        sealed = seal_for_hub(hub_key=here, payload=json.dumps(batch).encode())
        offered.append(batch["hub"])
        return {"id": str(uuid.uuid4()), "sealed": base64.b64encode(sealed).decode()}

    def relay_answers(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        if path == "/relay/pull":
            receipts = [junk(n) for n in range(RECEIPTS_PER_PULL)]
            return {"leases": {}, "messages": [], "receipts": receipts, "more": True}
        return {}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)

    for _ in range(2):
        assert relay_pull_once(sessions=[])["receipts"] == 0

    assert len(set(offered)) > 2 * RECEIPTS_PER_PULL
    [rejected] = AuditEvent.objects.filter(kind="federation.receipt_rejected")
    assert rejected.target == settings.SWITCHBOARD_RELAY_URL
    assert rejected.detail["hub_key"] in offered and rejected.detail["why"]
