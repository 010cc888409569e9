"""Shared by the federation integration tests: a hub process in embedded mode, and a hub key held
by the test itself so it can talk to hubs and the relay the way a hub does."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sqlite3
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from nacl.encoding import Base64Encoder
from nacl.signing import SigningKey

from hub_topology import embedded
from tests.integration.harness import REPO, VENV_BIN, wait_until

ENROLL = "fed-enroll-key-" + "f" * 24


@dataclass
class FedHub:
    name: str
    url: str
    home: Path
    server: embedded.Hub

    def call(
        self, method: str, path: str, token: str | None = None, body: Any = None, **kw: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(
            method, f"{self.url}/api/v1/{path}", json=body, headers=headers, timeout=10, **kw
        )

    def register(self, name: str, **fields: Any) -> dict[str, Any]:
        response = self.call("POST", "sessions", ENROLL, {"name": name, **fields})
        assert response.status_code == 201, response.text
        return response.json()

    def send(self, who: dict[str, Any], to: str, text: str, **fields: Any) -> httpx.Response:
        return self.call("POST", "messages", who["token"], {"to": to, "message": text, **fields})

    def inbox(self, who: dict[str, Any]) -> list[dict[str, Any]]:
        return self.call("GET", "inbox", who["token"]).json()["messages"]

    def status(self, who: dict[str, Any], message_id: str) -> dict[str, Any]:
        return self.call("GET", f"messages/{message_id}", who["token"]).json()

    def public_key(self) -> str:
        return self.call("GET", "federation/hub").json()["public_key"]

    def operator_token(self) -> str:
        """An operator token for this hub (minted once, with its own home's database)."""
        if not getattr(self, "_operator", None):
            self._operator = operator_token_mint(self.home, f"op-{self.name}")
        return self._operator

    def pin(self, public_key: str, *, name: str = "", url: str = "", tier: str = "lan") -> dict[str, Any]:
        """This hub's operator pins another hub's key (with a URL it becomes a LAN peer)."""
        response = self.call(
            "POST",
            "federation/peers",
            self.operator_token(),
            {"public_key": public_key, "name": name, "url": url, "tier": tier},
        )
        assert response.status_code in (200, 201), response.text
        return response.json()

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.home / "switchboard.sqlite3", timeout=10)


def operator_token_mint(home: Path, name: str) -> str:
    """An operator token for the embedded hub whose home is `home` (`manage.py operator_token`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "DATABASE_URL"))}
    env["SWITCHBOARD_HOME"] = str(home)
    out = subprocess.run(
        [str(VENV_BIN / "python"), "manage.py", "operator_token", name],
        cwd=REPO,
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def hub_key_precreate(home: Path) -> str:
    """Give a hub its key before it starts (as an operator may), so another hub can be configured
    with it (`SWITCHBOARD_LAN_PEERS=url#key`). Returns the public key."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = SigningKey.generate()
    path = home / "hub.key"
    path.write_text(base64.b64encode(bytes(key)).decode() + "\n", encoding="ascii")
    path.chmod(0o600)
    return key.verify_key.encode(Base64Encoder).decode()


def start_hub(
    name: str,
    workdir: Path,
    *,
    role: str = "hub",
    registry: Path,
    lan: list[str] = (),
    relay: str = "",
    port: int | None = None,
    extra: dict[str, str] | None = None,
) -> FedHub:
    """An embedded hub named `name` (home: `workdir/name`) with the federation settings the tests
    use, started as every embedded hub is (`hub_topology.embedded.start_hub`)."""
    home = workdir / name
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings = {
        "SWITCHBOARD_HUB_NAME": name,
        "SWITCHBOARD_ENROLL_KEY": ENROLL,
        "SWITCHBOARD_REGISTRY_DIR": str(registry),
        "SWITCHBOARD_LAN_PEERS": ",".join(lan),
        "SWITCHBOARD_RELAY_URL": relay,
        "SWITCHBOARD_FEDERATION_POLL_SECONDS": "0.5",
        "SWITCHBOARD_HOSTS_CACHE_SECONDS": "1",
        "SWITCHBOARD_JOBS": "thread",
        **(extra or {}),
    }
    server = embedded.start_hub(
        home, extra_env=settings, args=["--role", role], port=port, defaults_only=True
    )
    return FedHub(name, server.url, home, server)


def wait_state(
    hub: FedHub, who: dict[str, Any], message_id: str, wanted: str, timeout: float = 20
) -> dict[str, Any]:
    return wait_until(
        lambda: (s := hub.status(who, message_id))["status"] == wanted and s,
        timeout=timeout,
        what=f"{message_id} to be {wanted} on {hub.name}",
        interval=0.2,
    )


def wait_inbox(hub: FedHub, who: dict[str, Any], timeout: float = 20) -> list[dict[str, Any]]:
    return wait_until(
        lambda: hub.inbox(who), timeout=timeout, what=f"a message for {who['name']}", interval=0.2
    )


class HubKey:
    """A hub key held by the test itself, to talk to hubs and the relay the way a hub does."""

    def __init__(self, name: str = "test-hub") -> None:
        self.key = SigningKey.generate()
        self.name = name
        self.public_key = self.key.verify_key.encode(Base64Encoder).decode()

    def headers(self, method: str, path: str, body: bytes, dest_key: str) -> dict[str, str]:
        """Request signature headers (version 2: nonce and destination, see federation.services.signatures)."""
        stamp = str(int(time.time()))
        nonce = secrets.token_urlsafe(18)
        data = "\n".join(
            [
                "switchboard-request-2",
                method,
                path,
                stamp,
                nonce,
                dest_key,
                self.name,
                "",
                hashlib.sha256(body).hexdigest(),
            ]
        ).encode()
        return {
            "X-Switchboard-Hub": self.public_key,
            "X-Switchboard-Hub-Name": self.name,
            "X-Switchboard-Time": stamp,
            "X-Switchboard-Nonce": nonce,
            "X-Switchboard-Dest": dest_key,
            "X-Switchboard-Signature": base64.b64encode(self.key.sign(data).signature).decode(),
            "Content-Type": "application/json",
        }

    def lease(self, agent: str, relay: FedHub, *, lease_seconds: int = 60) -> dict[str, Any]:
        """This key's signed statement that it leases `agent` (a lower-case name, as the relay
        keys it) at `relay`, good from now for `lease_seconds` plus 30 s (switchboard-lease-1, see
        federation.services.signatures): what a hub sends with each lease it takes."""
        issued = int(time.time())
        facts = {
            "agent": agent,
            "hub": self.public_key,
            "relay": relay.public_key(),
            "issued_at": issued,
            "valid_until": issued + lease_seconds + 30,
        }
        signed = json.dumps(
            {"v": "switchboard-lease-1", "of": "relay-lease", **facts}, sort_keys=True, separators=(",", ":")
        ).encode()
        signature = base64.b64encode(self.key.sign(signed).signature).decode()
        return {"v": "switchboard-lease-1", **facts, "signature": signature}

    def take_lease(self, relay: FedHub, agent: str) -> httpx.Response:
        """Take (or renew) this key's lease on `agent` at `relay`, with its statement."""
        return self.call(
            relay, "POST", "relay/leases", {"agent": agent, "statement": self.lease(agent, relay)}
        )

    def pull(self, relay: FedHub, agents: list[str]) -> httpx.Response:
        """One pull cycle at `relay`, as a hub pulls: each lease renewed with its statement."""
        statements = {agent: self.lease(agent, relay) for agent in agents}
        return self.call(relay, "POST", "relay/pull", {"agents": agents, "statements": statements})

    def signed(
        self, hub: FedHub, method: str, path: str, body: Any = None
    ) -> tuple[str, bytes, dict[str, str]]:
        """URL, body and headers of a call to `hub` (a forward sealed to its key, as hubs send them)."""
        dest = hub.public_key()
        raw = b"" if body is None else json.dumps(body).encode()
        full = f"/api/v1/{path}"
        sealed = path == "federation/messages"
        if sealed:
            raw = seal_to(dest, raw)
        headers = self.headers(method, full, raw, dest)
        if sealed:
            headers["Content-Type"] = "application/x-switchboard-sealed"
        return hub.url + full, raw, headers

    def call(self, hub: FedHub, method: str, path: str, body: Any = None) -> httpx.Response:
        url, raw, headers = self.signed(hub, method, path, body)
        return httpx.request(method, url, content=raw, headers=headers, timeout=10)

    def envelope(
        self,
        *,
        to: str,
        text: str,
        hops: int = 1,
        files: list[dict[str, Any]] | None = None,
        sender: str = "tester",
        sender_id: str = "t-1",
        url: str = "",
        priority: str = "normal",
        dest: str = "",
    ) -> dict[str, Any]:
        """A message envelope signed as a hub signs one (version 3: every field a recipient sees and
        the key of the hub it is made for, `dest`; a hub verifies it only as that hub)."""
        envelope = {
            "v": 3,
            "id": str(uuid.uuid4()),
            "from": {
                "hub": self.public_key,
                "hub_name": self.name,
                "url": url,
                "id": sender_id,
                "name": sender,
                "ref": "tstr23",
            },
            "to": to,
            "dest": dest,
            "text": text,
            "summary": "",
            "priority": priority,
            "kind": "text",
            "created_at": "2026-01-01T00:00:00+00:00",
            "hops": hops,
            "files": files or [],
        }
        signed = json.dumps(
            {
                "v": 3,
                "id": envelope["id"],
                "from": envelope["from"],
                "to": to,
                "dest": dest,
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
                "summary": envelope["summary"],
                "priority": envelope["priority"],
                "kind": envelope["kind"],
                "created_at": envelope["created_at"],
                "files": [[f["sha256"], f["name"]] for f in envelope["files"]],
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        envelope["signature"] = base64.b64encode(self.key.sign(signed).signature).decode()
        return envelope


def seal_to(public_key: str, payload: bytes) -> bytes:
    """`payload` sealed to the hub holding `public_key` (as hubs seal forwards and relay messages)."""
    from nacl.public import PublicKey, SealedBox
    from nacl.signing import VerifyKey

    curve = VerifyKey(base64.b64decode(public_key)).to_curve25519_public_key()
    return SealedBox(PublicKey(bytes(curve))).encrypt(payload)
