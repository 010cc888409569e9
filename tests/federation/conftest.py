"""Fixtures for federation tests: another hub's key, signed calls through the test client."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from nacl.encoding import Base64Encoder
from nacl.signing import SigningKey


def federation_isolated(settings: Any, tmp_path: Path) -> None:
    """Registry and files in the test's own folders; caches empty; this hub not a relay and with
    no other hub configured."""
    from federation.services.discovery import discovery_cache_clear
    from federation.services.forwarding import hosts_cache_clear

    settings.SWITCHBOARD_REGISTRY_DIR = tmp_path / "registry"
    settings.SWITCHBOARD_FILES_DIR = tmp_path / "files"
    settings.SWITCHBOARD_PUBLIC_URL = ""
    settings.SWITCHBOARD_RELAY_URL = ""
    settings.SWITCHBOARD_LAN_PEERS = []
    settings.SWITCHBOARD_ROLE = "hub"
    hosts_cache_clear()
    discovery_cache_clear()


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    federation_isolated(settings, tmp_path)


@dataclass
class OtherHub:
    """A hub that is not this one: its own key, able to sign envelopes and requests."""

    key: SigningKey
    name: str = "other-hub"

    @property
    def public_key(self) -> str:
        return self.key.verify_key.encode(Base64Encoder).decode("ascii")

    def envelope(
        self,
        *,
        to: str,
        text: str,
        sender_name: str = "alice",
        hops: int = 1,
        dest: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A message envelope this hub signs for the hub holding `dest` (default: the hub under test)."""
        from federation.services.identity import hub_identity
        from federation.services.signatures import envelope_sign

        envelope = {
            "id": str(uuid.uuid4()),
            "from": {
                "hub": self.public_key,
                "hub_name": self.name,
                "url": "",
                "id": str(uuid.uuid4()),
                "name": sender_name,
                "ref": "abc234",
            },
            "to": to,
            "dest": dest or hub_identity().public_key,
            "text": text,
            "summary": "",
            "priority": "normal",
            "hops": hops,
            "files": [],
            **extra,
        }
        return envelope_sign(envelope, key=self.key)

    def lease(self, agent: str, *, relay_key: str | None = None, now: float | None = None) -> dict[str, Any]:
        """This hub's signed statement that it leases `agent` at the relay holding `relay_key`
        (default: the hub under test, in relay role), issued at `now` (default: now)."""
        from federation.services.identity import hub_identity
        from federation.services.signatures import lease_statement_sign

        return lease_statement_sign(
            agent=agent, relay_key=relay_key or hub_identity().public_key, now=now, key=self.key
        )

    def call(self, client: Client, method: str, path: str, body: Any = None, *, sealed: bool = True) -> Any:
        """A signed call to this hub as the other hub would make it (a forward sealed to this hub)."""
        from federation.services.forwarding import seal_for_hub
        from federation.services.identity import hub_identity
        from federation.services.signatures import request_sign
        from federation.transport import SEALED_TYPE

        me = hub_identity().public_key
        raw = b"" if body is None else json.dumps(body).encode()
        content_type = "application/json"
        if path.endswith("/federation/messages") and sealed:
            raw, content_type = seal_for_hub(hub_key=me, payload=raw), SEALED_TYPE
        headers = request_sign(
            method=method, path=path, body=raw, dest_key=me, key=self.key, name=self.name
        ).claim.headers()
        meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
        fn = getattr(client, method.lower())
        if method == "GET":
            response = fn(path, **meta)
        else:
            response = fn(path, data=raw, content_type=content_type, **meta)
        response.sent_headers = meta
        response.sent_body = raw
        response.json_body = response.json() if response.content else None
        return response


@pytest.fixture
def other_hub() -> OtherHub:
    return OtherHub(SigningKey.generate())


@pytest.fixture
def hub_client(db: None) -> Client:
    return Client()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def make_hub() -> Callable[[str], OtherHub]:
    return lambda name: OtherHub(SigningKey.generate(), name=name)


def answer_signed(
    key: SigningKey,
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes,
    status: int,
    body: bytes,
) -> dict[str, str]:
    """The answer signature headers the hub holding `key` sends back with `status` and `body` to
    the request it received (`method`, `url`, its `headers` and `content`): a genuine hub's answer."""
    from federation.services.signatures import HubRequest, answer_headers, request_claim

    split = urlsplit(url)
    received = HubRequest(
        method=method,
        path=split.path + (f"?{split.query}" if split.query else ""),
        claim=request_claim(headers),
        body_sha256=hashlib.sha256(content).hexdigest(),
    )
    return answer_headers(received, status=status, body=body, key=key)


Answer = tuple[int, bytes, dict[str, str]]


class HubAddress:
    """A loopback HTTP server standing in for another hub or a relay at its address. `answer`
    makes each answer from the request it got: the hub's own, signed with its key (`signed_by`),
    or whatever someone else answering there makes up (by default `queued`, unsigned). Every
    request (method, path, url, headers, body as `content`, and its raw bytes as an eavesdropper
    sees them, `wire`) is kept with its answer."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[dict[str, Any], Answer]] = []
        self.answer: Callable[[dict[str, Any]], Answer] = lambda request: unsigned(201, {"status": "queued"})
        address = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                content = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = {
                    "method": self.command,
                    "path": self.path,
                    "url": address.url + self.path,
                    "headers": self.headers,
                    "content": content,
                    "wire": bytes(str(self.headers), "latin-1") + content,
                }
                status, body, headers = address.answer(request)
                address.exchanges.append((request, (status, body, headers)))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = _serve  # noqa: N815
            do_POST = _serve  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [request for request, _ in self.exchanges]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def unsigned(status: int, body: dict[str, Any]) -> Answer:
    """An answer nobody signed."""
    return status, json.dumps(body).encode(), {}


def signed_by(
    key: SigningKey,
    request: dict[str, Any],
    status: int,
    body: dict[str, Any],
    *,
    sent: tuple[int, dict[str, Any]] | None = None,
) -> Answer:
    """`status` and `body` signed by `key` as its answer to `request`; with `sent`, that status and
    body go on the wire under the signature instead (the answer altered on the way)."""
    raw = json.dumps(body).encode()
    headers = answer_signed(
        key,
        method=request["method"],
        url=request["url"],
        headers=request["headers"],
        content=request["content"],
        status=status,
        body=raw,
    )
    if sent is not None:
        return sent[0], json.dumps(sent[1]).encode(), headers
    return status, raw, headers


def pin_hub(hub: OtherHub, tier: str = "lan") -> None:
    """This hub's operator vouches for `hub`'s key on `tier` (what the tier of its messages follows)."""
    from federation.models import Peer

    Peer.objects.update_or_create(
        public_key=hub.public_key, defaults={"name": hub.name, "tier": tier, "pinned": True}
    )
