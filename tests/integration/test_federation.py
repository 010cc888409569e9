"""Federation with real processes: four hubs on loopback, each its own home and SQLite database.

  A ─┬─ channel (shared registry folder) ── B
     ├─ LAN (A lists C as a LAN peer; C has its own registry, so it is "another machine")
     └─ relay R (`switchboard serve --role relay`), which A, B and C all pull from
  B reaches C's agents only through the relay.

Every hub runs its background jobs in-process (forwarding, receipts, relay pulls every 0.5 s).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from nacl.encoding import Base64Encoder
from nacl.public import PublicKey, SealedBox
from nacl.signing import SigningKey

from tests.integration.harness import VENV_BIN, Proc, free_port, wait_until

pytestmark = pytest.mark.integration
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


def _start(
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


@dataclass
class Topology:
    a: FedHub
    b: FedHub
    c: FedHub
    r: FedHub
    agents: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """Relay R; hubs A and B sharing a registry; hub C (own registry) as A's LAN peer."""
    work = tmp_path_factory.mktemp("federation")
    shared, other = work / "registry-shared", work / "registry-c"
    started: list[FedHub] = []
    try:
        r = _start(
            "relay",
            work,
            role="relay",
            registry=work / "registry-relay",
            extra={"SWITCHBOARD_RELAY_LEASE_SECONDS": "3"},  # hubs renew every 0.5 s
        )
        started.append(r)
        c_port = free_port()
        c = _start("hub-c", work, registry=other, relay=r.url, port=c_port)
        started.append(c)
        a = _start("hub-a", work, registry=shared, lan=[c.url], relay=r.url)
        started.append(a)
        b = _start("hub-b", work, registry=shared, relay=r.url)
        started.append(b)
        agents = {
            "alice": a.register("alice", cwd="/w/alice"),
            "bob": b.register("bob", cwd="/w/bob"),
            "carol": c.register("carol", cwd="/w/carol"),
        }
        # C's relay lease on carol is taken on its next pull cycle.
        wait_until(
            lambda: (
                r.db()
                .execute("select count(*) from federation_relaylease where agent_key='carol'")
                .fetchone()[0]
            ),
            timeout=20,
            what="carol's lease",
        )
        yield Topology(a, b, c, r, agents)
    finally:
        for hub in reversed(started):
            hub.proc.stop()


def _wait_state(
    hub: FedHub, who: dict[str, Any], message_id: str, wanted: str, timeout: float = 20
) -> dict[str, Any]:
    return wait_until(
        lambda: (s := hub.status(who, message_id))["status"] == wanted and s,
        timeout=timeout,
        what=f"{message_id} to be {wanted} on {hub.name}",
        interval=0.2,
    )


def _wait_inbox(hub: FedHub, who: dict[str, Any], timeout: float = 20) -> list[dict[str, Any]]:
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


def test_discovery_lists_remote_agents_with_their_tier(fed):
    listed = fed.a.call("GET", "agents", fed.agents["alice"]["token"]).json()["agents"]
    tiers = {(a["name"], a["tier"]) for a in listed}
    assert ("alice", "host") in tiers
    assert ("bob", "channel") in tiers
    assert ("carol", "lan") in tiers
    assert ("carol", "relay") in tiers  # the relay lists leased names too


def test_channel_delivery_with_receipts_back_to_the_sender(fed):
    alice, bob = fed.agents["alice"], fed.agents["bob"]
    sent = fed.a.send(alice, "bob", "channel hello")
    assert sent.status_code == 201, sent.text
    body = sent.json()
    assert body["status"] in ("relayed", "delivered")
    message_id = body["id"]
    [frame] = _wait_inbox(fed.b, bob)
    assert frame["id"] == message_id
    assert frame["trust"] == "channel-verified" and frame["delivery_tier"] == "channel"
    _wait_state(fed.a, alice, message_id, "delivered")
    fed.b.call("POST", "inbox/ack", bob["token"], {"ids": [message_id]})
    status = _wait_state(fed.a, alice, message_id, "read")
    assert status["deliveries"][0]["tier"] == "channel"


def test_lan_delivery(fed):
    alice, carol = fed.agents["alice"], fed.agents["carol"]
    sent = fed.a.send(alice, "carol", "lan hello")
    assert sent.status_code == 201, sent.text
    [frame] = _wait_inbox(fed.c, carol)
    assert frame["text"] == "lan hello"
    assert frame["trust"] == "lan-verified" and frame["delivery_tier"] == "lan"
    _wait_state(fed.a, alice, sent.json()["id"], "delivered")


def test_a_reply_goes_back_over_the_lan_to_a_hub_that_wrote_first(fed):
    alice, carol = fed.agents["alice"], fed.agents["carol"]
    fed.a.inbox(alice)  # empty it
    reply = fed.c.send(carol, "alice", "got it, thanks")  # C has no LAN peers configured
    assert reply.status_code == 201, reply.text
    [frame] = _wait_inbox(fed.a, alice)
    assert frame["text"] == "got it, thanks"
    assert (frame["delivery_tier"], frame["trust"]) == ("lan", "lan-verified")


def test_relay_delivery_sealed_end_to_end_with_receipts(fed):
    bob, carol = fed.agents["bob"], fed.agents["carol"]
    secret = f"relay-plaintext-{uuid.uuid4().hex}"
    sent = fed.b.send(bob, "carol", secret)
    assert sent.status_code == 201, sent.text
    body = sent.json()
    assert body["status"] == "relayed" and "relay" in body["result"]
    [frame] = _wait_inbox(fed.c, carol)
    assert frame["text"] == secret
    assert frame["trust"] == "relay-verified" and frame["delivery_tier"] == "relay"
    fed.c.call("POST", "inbox/ack", carol["token"], {"ids": [frame["id"]]})
    _wait_state(fed.b, bob, body["id"], "read", timeout=30)
    # The relay saw routing metadata only: the text is nowhere in its database files.
    for path in fed.r.home.glob("switchboard.sqlite3*"):
        assert secret.encode() not in path.read_bytes(), path
    kinds = [
        row[0]
        for row in fed.r.db().execute(
            "select kind from federation_relaymessage where message_id = ?", (body["id"].replace("-", ""),)
        )
    ]
    assert kinds.count("message") <= 1  # (the receipt batch back to B may share the id)


def test_unknown_name_is_not_found_not_queued(fed):
    response = fed.b.send(fed.agents["bob"], "nobody-anywhere", "hello?")
    assert response.status_code == 404


def test_tier_order_channel_before_lan_before_relay(fed):
    alice = fed.agents["alice"]
    dup_b = fed.b.register("dup", cwd="/w/dup-b")
    dup_c = fed.c.register("dup", cwd="/w/dup-c")
    first = fed.a.send(alice, "dup", "which tier?")
    assert first.status_code == 201, first.text
    assert _wait_inbox(fed.b, dup_b)[0]["delivery_tier"] == "channel"
    fed.b.call("DELETE", "sessions/me", dup_b["token"])
    time.sleep(1.2)  # past the hosts cache
    second = fed.a.send(alice, "dup", "and now?", idempotency_key="dup-2")
    assert second.status_code == 201, second.text
    assert _wait_inbox(fed.c, dup_c)[0]["delivery_tier"] == "lan"

    # Only a relay-reachable copy left: a hub (this test's key) that leases the name at the relay.
    fed.c.call("DELETE", "sessions/me", dup_c["token"])
    far = HubKey("far-hub")
    wait_until(
        lambda: far.call(fed.r, "POST", "relay/leases", {"agent": "dup"}).status_code == 200,
        timeout=15,
        what="C's lease on dup to lapse",
        interval=0.5,
    )
    time.sleep(1.2)  # past the hosts cache
    third = fed.a.send(alice, "dup", "and via the relay?", idempotency_key="dup-3")
    assert third.status_code == 201, third.text
    assert third.json()["status"] == "relayed"
    items = wait_until(
        lambda: far.call(fed.r, "POST", "relay/pull", {"agents": ["dup"]}).json()["messages"],
        timeout=20,
        what="A's message at the relay",
        interval=0.3,
    )
    opened = json.loads(
        SealedBox(far.key.to_curve25519_private_key()).decrypt(base64.b64decode(items[0]["sealed"]))
    )
    assert opened["text"] == "and via the relay?" and opened["from"]["hub"] == fed.a.public_key()
    status = fed.a.status(alice, third.json()["id"])
    assert status["deliveries"][0]["tier"] == "relay"
    assert status["deliveries"][0]["remote"]["remote_state"] == "at_relay"


def test_a_session_live_in_another_hub_on_this_machine_cannot_register_again(fed):
    response = fed.a.call("POST", "sessions", ENROLL, {"name": "bob", "cwd": "/w/bob"})
    assert response.status_code == 409, response.text


def test_failed_signature_is_unverified_and_sensitive(fed):
    tester = HubKey()
    envelope = tester.envelope(to="bob", text="an ordinary note")
    envelope["text"] = "an ordinary note, altered"
    response = tester.call(fed.b, "POST", "federation/messages", {"tier": "lan", "envelope": envelope})
    assert response.status_code == 201, response.text
    assert response.json()["trust"] == "unverified"
    assert response.json()["status"] == "held"
    tier, trust = (
        fed.b.db()
        .execute("select tier, trust from messaging_message where id = ?", (envelope["id"].replace("-", ""),))
        .fetchone()
    )
    assert (tier, trust) == ("sensitive", "unverified")


def test_hop_cap(fed):
    tester = HubKey()
    response = tester.call(
        fed.b,
        "POST",
        "federation/messages",
        {"tier": "lan", "envelope": tester.envelope(to="bob", text="loop", hops=99)},
    )
    assert response.status_code == 400 and response.json()["error"] == "hop_limit"


def test_duplicate_forward_is_delivered_once(fed):
    tester = HubKey()
    bob = fed.b.register("bob-dup", cwd="/w/bd")
    envelope = tester.envelope(to="bob-dup", text="once only")
    codes = [
        tester.call(fed.b, "POST", "federation/messages", {"tier": "lan", "envelope": envelope}).status_code
        for _ in range(3)
    ]
    assert codes == [201, 200, 200]
    assert len(fed.b.inbox(bob)) == 1
    assert fed.b.inbox(bob) == []


def test_file_sent_across_hubs_arrives_intact_and_a_changed_file_is_left_out(fed):
    alice = fed.agents["alice"]
    bob = fed.b.register("filer", cwd="/w/filer")
    data = os.urandom(4096)
    uploaded = httpx.post(
        f"{fed.a.url}/api/v1/files",
        files={"file": ("data.bin", data)},
        headers={"Authorization": f"Bearer {alice['token']}"},
        timeout=10,
    )
    assert uploaded.status_code == 201, uploaded.text
    sent = fed.a.send(
        alice,
        "filer",
        "a file for you",
        files=[{"sha256": uploaded.json()["sha256"], "name": "/home/alice/data.bin"}],
    )
    assert sent.status_code == 201, sent.text
    [frame] = _wait_inbox(fed.b, bob)
    [kept] = frame["files"]
    assert kept["sha256"] == hashlib.sha256(data).hexdigest()
    assert Path(kept["path"]).read_bytes() == data
    assert "/home/alice" not in kept["path"]

    tester = HubKey()
    bad = {
        "name": "x.txt",
        "size": 3,
        "sha256": hashlib.sha256(b"abc").hexdigest(),
        "data": base64.b64encode(b"abd").decode(),
    }
    response = tester.call(
        fed.b,
        "POST",
        "federation/messages",
        {"tier": "lan", "envelope": tester.envelope(to="filer", text="tampered file", files=[bad])},
    )
    assert response.status_code == 201, response.text
    [frame] = _wait_inbox(fed.b, bob)
    assert "FILES=0" in frame["marker"]
    assert "mismatch" in frame["files"][0]["problem"]


def test_lease_is_exclusive(fed):
    intruder = HubKey("intruder")
    assert intruder.call(fed.r, "POST", "relay/leases", {"agent": "carol"}).status_code == 409
    assert (
        intruder.call(fed.r, "POST", "relay/claims", {"agent": "carol", "kind": "message"}).status_code == 409
    )
    assert intruder.call(fed.r, "POST", "relay/leases", {"agent": "someone-new"}).status_code == 200


def _seal(public_key: str, payload: bytes) -> str:
    from nacl.signing import VerifyKey

    curve = VerifyKey(base64.b64decode(public_key)).to_curve25519_public_key()
    return base64.b64encode(SealedBox(PublicKey(bytes(curve))).encrypt(payload)).decode()


def test_claims_are_atomic_between_concurrent_pullers(fed):
    owner = HubKey("puller")
    agent = f"worker-{uuid.uuid4().hex[:6]}"
    assert owner.call(fed.r, "POST", "relay/leases", {"agent": agent}).status_code == 200
    ids = set()
    for i in range(30):
        mid = str(uuid.uuid4())
        ids.add(mid)
        stored = owner.call(
            fed.r,
            "POST",
            "relay/messages",
            {
                "message_id": mid,
                "dest_hub": owner.public_key,
                "agent": agent,
                "sealed": _seal(owner.public_key, f"m{i}".encode()),
            },
        )
        assert stored.status_code == 201, stored.text
    got: list[list[str]] = [[], [], []]
    other = HubKey("other-hub")

    def pull(slot: int, who: HubKey) -> None:
        for _ in range(20):
            if who is owner:  # the lease holder's pull cycle: renew the lease, claim
                response = who.call(fed.r, "POST", "relay/pull", {"agents": [agent]})
                got[slot].extend(item["message_id"] for item in response.json()["messages"])
                continue
            response = who.call(fed.r, "POST", "relay/claims", {"agent": agent, "kind": "message"})
            if response.status_code != 200:
                got[slot].append(f"refused:{response.status_code}")
                continue
            got[slot].extend(item["message_id"] for item in response.json())

    threads = [
        threading.Thread(target=pull, args=(0, owner)),
        threading.Thread(target=pull, args=(1, owner)),
        threading.Thread(target=pull, args=(2, other)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    claimed = got[0] + got[1]
    assert sorted(claimed) == sorted(ids)  # every message claimed exactly once
    assert set(got[2]) == {"refused:409"}  # a hub without the lease never gets one


def test_a_claim_whose_local_delivery_fails_is_released(fed):
    tester = HubKey("relay-sender")
    c_key = fed.c.public_key()
    envelope = tester.envelope(to="not-on-c", text="undeliverable here")
    sealed = _seal(c_key, json.dumps(envelope).encode())
    stored = tester.call(
        fed.r,
        "POST",
        "relay/messages",
        {"message_id": envelope["id"], "dest_hub": c_key, "agent": "carol", "sealed": sealed},
    )
    assert stored.status_code == 201, stored.text
    row_id = stored.json()["id"].replace("-", "")

    def released_after_a_try() -> bool:
        log = fed.c.proc.log()
        row = (
            fed.r.db()
            .execute("select done, claimed_by from federation_relaymessage where id = ?", (row_id,))
            .fetchone()
        )
        return envelope["id"] in log and row is not None and row[0] == 0 and row[1] == ""

    wait_until(
        released_after_a_try, timeout=20, what="C to claim, fail and release the message", interval=0.1
    )


def test_a_hub_forwards_onward_one_hop_and_the_hop_cap_stops_it(fed):
    tester = HubKey("far-away")
    bob = fed.b.register("bob-onward", cwd="/w/bo")
    onward = tester.call(
        fed.a,
        "POST",
        "federation/messages",
        {"tier": "lan", "envelope": tester.envelope(to="bob-onward", text="via A")},
    )
    assert onward.status_code == 201, onward.text
    [frame] = _wait_inbox(fed.b, bob)
    assert frame["text"] == "via A" and frame["trust"] == "channel-verified"
    capped = tester.envelope(to="bob-onward", text="no further", hops=3)
    assert (
        tester.call(fed.a, "POST", "federation/messages", {"tier": "lan", "envelope": capped}).status_code
        == 404
    )
    assert fed.b.inbox(bob) == []
