"""Shared by the federation integration tests: a hub process in embedded mode, and a hub key held
by the test itself so it can talk to hubs and the relay the way a hub does."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from nacl.encoding import Base64Encoder
from nacl.signing import SigningKey

from tests.integration.harness import VENV_BIN, Proc, free_port, wait_until

ENROLL = "fed-enroll-key-" + "f" * 24


@dataclass
class FedHub:
    name: str
    url: str
    home: Path
    proc: Proc

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

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.home / "switchboard.sqlite3", timeout=10)


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
    port = port or free_port()
    home = workdir / name
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update(
        SWITCHBOARD_HOME=str(home),
        SWITCHBOARD_HUB_NAME=name,
        SWITCHBOARD_ENROLL_KEY=ENROLL,
        SWITCHBOARD_REGISTRY_DIR=str(registry),
        SWITCHBOARD_LAN_PEERS=",".join(lan),
        SWITCHBOARD_RELAY_URL=relay,
        SWITCHBOARD_FEDERATION_POLL_SECONDS="0.5",
        SWITCHBOARD_HOSTS_CACHE_SECONDS="1",
        SWITCHBOARD_JOBS="thread",
    )
    env.update(extra or {})
    proc = Proc(
        f"fed-{name}",
        [str(VENV_BIN / "switchboard"), "serve", "--host", "127.0.0.1", "--port", str(port), "--role", role],
        env,
        workdir / f"{name}.log",
    ).start()
    hub = FedHub(name, f"http://127.0.0.1:{port}", home, proc)
    try:
        wait_until(
            lambda: proc.alive() and hub.call("GET", "federation/hub").status_code == 200,
            timeout=60,
            what=f"hub {name}",
        )
    except TimeoutError:
        proc.stop()
        raise AssertionError(f"hub {name} did not start:\n{proc.log()[-3000:]}") from None
    return hub


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

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        stamp = str(int(time.time()))
        data = "\n".join([method, path, stamp, hashlib.sha256(body).hexdigest()]).encode()
        return {
            "X-Switchboard-Hub": self.public_key,
            "X-Switchboard-Hub-Name": self.name,
            "X-Switchboard-Time": stamp,
            "X-Switchboard-Signature": base64.b64encode(self.key.sign(data).signature).decode(),
            "Content-Type": "application/json",
        }

    def call(self, hub: FedHub, method: str, path: str, body: Any = None) -> httpx.Response:
        raw = b"" if body is None else json.dumps(body).encode()
        full = f"/api/v1/{path}"
        return httpx.request(
            method, hub.url + full, content=raw, headers=self.headers(method, full, raw), timeout=10
        )

    def envelope(
        self, *, to: str, text: str, hops: int = 1, files: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        envelope = {
            "v": 1,
            "id": str(uuid.uuid4()),
            "from": {
                "hub": self.public_key,
                "hub_name": self.name,
                "url": "",
                "id": "t-1",
                "name": "tester",
                "ref": "tstr23",
            },
            "to": to,
            "text": text,
            "hops": hops,
            "files": files or [],
        }
        signed = json.dumps(
            {
                "v": 1,
                "id": envelope["id"],
                "hub": self.public_key,
                "sender": ["t-1", "tester"],
                "to": to,
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
                "files": [f["sha256"] for f in envelope["files"]],
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        envelope["signature"] = base64.b64encode(self.key.sign(signed).signature).decode()
        return envelope
