"""The LAN tier across real, separate addresses: two hubs in two network namespaces this test
creates (joined by a veth pair), each seeing the other only as a LAN peer. Needs root (`ip netns`);
skipped otherwise. Every request is made from inside a namespace, so nothing leaves them."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fedhubs import hub_key_precreate, operator_token_mint
from tests.integration.harness import VENV_BIN, Proc, wait_until

pytestmark = pytest.mark.integration
try:
    import zeroconf  # noqa: F401

    MDNS = True
except ImportError:
    MDNS = False
ENROLL = "lan-enroll-key-" + "l" * 24
PORT = 8765

CLIENT = """
import json, sys, httpx
method, url, token, body = json.loads(sys.argv[1])
headers = {"Authorization": f"Bearer {token}"} if token else {}
r = httpx.request(method, url, json=body, headers=headers, timeout=10)
print(json.dumps({"status": r.status_code, "body": r.json() if r.content else None}))
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@pytest.fixture(scope="module")
def lan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = secrets.token_hex(3)
    ns = [f"sbfed-{tag}-a", f"sbfed-{tag}-b"]
    veth = [f"sbf{tag}a", f"sbf{tag}b"]
    octet = 100 + secrets.randbelow(100)
    addr = [f"10.231.{octet}.1", f"10.231.{octet}.2"]
    work = tmp_path_factory.mktemp("lan-netns")
    procs: list[Proc] = []
    made: list[str] = []
    try:
        for name in ns:
            _ip("netns", "add", name)
            made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("link", "add", veth[0], "netns", ns[0], "type", "veth", "peer", "name", veth[1], "netns", ns[1])
        for i in (0, 1):
            _ip("-n", ns[i], "addr", "add", f"{addr[i]}/24", "dev", veth[i])
            _ip("-n", ns[i], "link", "set", veth[i], "up")
        # Keys made before the hubs start, so each can be told the other's (what it seals to).
        keys = [hub_key_precreate(work / f"hub-{i}") for i in (0, 1)]
        for i in (0, 1):
            home = work / f"hub-{i}"
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("SWITCHBOARD_", "DATABASE_URL", "REDIS_URL"))
            }
            env.update(
                SWITCHBOARD_HOME=str(home),
                SWITCHBOARD_HUB_NAME=f"lan-{i}",
                SWITCHBOARD_ENROLL_KEY=ENROLL,
                # With zeroconf installed the hubs find each other by mDNS (and use what they find
                # once an operator pinned its key, below); otherwise by URL and key.
                SWITCHBOARD_LAN_PEERS="" if MDNS else f"http://{addr[1 - i]}:{PORT}#{keys[1 - i]}",
                SWITCHBOARD_LAN_DISCOVERY="1" if MDNS else "0",
                SWITCHBOARD_HOSTS_CACHE_SECONDS="1",
                SWITCHBOARD_FEDERATION_POLL_SECONDS="0.5",
                SWITCHBOARD_ALLOWED_HOSTS=f"{addr[i]},127.0.0.1",
                SWITCHBOARD_JOBS="thread",
            )
            argv = [
                "ip",
                "netns",
                "exec",
                ns[i],
                str(VENV_BIN / "switchboard"),
                "serve",
                "--host",
                addr[i],
                "--port",
                str(PORT),
            ]
            procs.append(Proc(f"lan-{i}", argv, env, work / f"hub-{i}.log").start())
        info = {"ns": ns, "urls": [f"http://{a}:{PORT}" for a in addr]}
        for i in (0, 1):
            try:
                wait_until(
                    lambda i=i: call(info, i, "GET", "federation/hub")["status"] == 200,
                    timeout=60,
                    what=f"LAN hub {i}",
                    interval=0.5,
                )
            except TimeoutError:
                raise AssertionError(procs[i].log()[-3000:]) from None
        if MDNS:
            for i in (0, 1):
                token = operator_token_mint(work / f"hub-{i}", f"op-lan-{i}")
                pinned = call(
                    info, i, "POST", "federation/peers", token, {"public_key": keys[1 - i], "tier": "lan"}
                )
                assert pinned["status"] == 201, pinned
        yield info
    finally:
        for proc in procs:
            proc.stop()
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


def call(
    info: dict[str, Any], i: int, method: str, path: str, token: str | None = None, body: Any = None
) -> dict[str, Any]:
    """Make one request from inside namespace `i` to the hub there."""
    args = json.dumps([method, f"{info['urls'][i]}/api/v1/{path}", token, body])
    out = subprocess.run(
        ["ip", "netns", "exec", info["ns"][i], sys.executable, "-c", CLIENT, args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_lan_peers_on_separate_addresses_discover_and_deliver_with_receipts(lan):
    alice = call(lan, 0, "POST", "sessions", ENROLL, {"name": "alice"})["body"]
    bob = call(lan, 1, "POST", "sessions", ENROLL, {"name": "bob"})["body"]
    wait_until(
        lambda: (
            ("bob", "lan")
            in {
                (a["name"], a["tier"])
                for a in call(lan, 0, "GET", "agents", alice["token"])["body"]["agents"]
            }
        ),
        timeout=30,
        what="hub 0 to discover bob on hub 1" + (" (mDNS)" if MDNS else ""),
        interval=1.0,
    )

    sent = call(lan, 0, "POST", "messages", alice["token"], {"to": "bob", "message": "across the LAN"})
    assert sent["status"] == 201, sent
    message_id = sent["body"]["id"]
    frames = wait_until(
        lambda: call(lan, 1, "GET", "inbox", bob["token"])["body"]["messages"],
        timeout=30,
        what="bob's message",
        interval=0.5,
    )
    assert frames[0]["text"] == "across the LAN"
    assert frames[0]["delivery_tier"] == "lan" and frames[0]["trust"] == "lan-verified"
    call(lan, 1, "POST", "inbox/ack", bob["token"], {"ids": [message_id]})
    wait_until(
        lambda: call(lan, 0, "GET", f"messages/{message_id}", alice["token"])["body"]["status"] == "read",
        timeout=30,
        what="the read receipt back at alice's hub",
        interval=0.5,
    )
