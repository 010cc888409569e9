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
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from nacl.public import PublicKey, SealedBox

from tests.integration.fedhubs import (
    ENROLL,
    FedHub,
    HubKey,
    hub_key_precreate,
    start_hub,
    wait_inbox,
    wait_state,
)
from tests.integration.harness import free_port, wait_until

pytestmark = pytest.mark.integration


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
        r = start_hub(
            "relay",
            work,
            role="relay",
            registry=work / "registry-relay",
            extra={"SWITCHBOARD_RELAY_LEASE_SECONDS": "5"},  # hubs renew every 0.5 s
        )
        started.append(r)
        c_port = free_port()
        c_key = hub_key_precreate(work / "hub-c")
        c = start_hub("hub-c", work, registry=other, relay=r.url, port=c_port)
        started.append(c)
        # A is configured with C's URL and key; B and C know each other's keys as their operators
        # pinned them (B reaches C through the relay; C answers A over the LAN).
        a = start_hub("hub-a", work, registry=shared, lan=[f"{c.url}#{c_key}"], relay=r.url)
        started.append(a)
        b = start_hub("hub-b", work, registry=shared, relay=r.url)
        started.append(b)
        b.pin(c_key, name="hub-c", tier="relay")
        c.pin(a.public_key(), name="hub-a", url=a.url, tier="lan")
        # C's operator vouches for B too: a hub key nobody vouched for gets its messages held.
        c.pin(b.public_key(), name="hub-b", tier="relay")
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
            hub.server.stop()


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
    [frame] = wait_inbox(fed.b, bob)
    assert frame["id"] == message_id
    assert frame["trust"] == "channel-verified" and frame["delivery_tier"] == "channel"
    wait_state(fed.a, alice, message_id, "delivered")
    fed.b.call("POST", "inbox/ack", bob["token"], {"ids": [message_id]})
    status = wait_state(fed.a, alice, message_id, "read")
    assert status["deliveries"][0]["tier"] == "channel"


def test_lan_delivery(fed):
    alice, carol = fed.agents["alice"], fed.agents["carol"]
    sent = fed.a.send(alice, "carol", "lan hello")
    assert sent.status_code == 201, sent.text
    [frame] = wait_inbox(fed.c, carol)
    assert frame["text"] == "lan hello"
    assert frame["trust"] == "lan-verified" and frame["delivery_tier"] == "lan"
    wait_state(fed.a, alice, sent.json()["id"], "delivered")


def test_a_reply_goes_back_over_the_lan_to_a_pinned_peer(fed):
    alice, carol = fed.agents["alice"], fed.agents["carol"]
    fed.a.inbox(alice)  # empty it
    reply = fed.c.send(carol, "alice", "got it, thanks")  # C's operator pinned A with its URL
    assert reply.status_code == 201, reply.text
    [frame] = wait_inbox(fed.a, alice)
    assert frame["text"] == "got it, thanks"
    assert (frame["delivery_tier"], frame["trust"]) == ("lan", "lan-verified")


def test_relay_delivery_sealed_end_to_end_with_receipts(fed):
    bob, carol = fed.agents["bob"], fed.agents["carol"]
    secret = f"relay-plaintext-{uuid.uuid4().hex}"
    sent = fed.b.send(bob, "carol", secret)
    assert sent.status_code == 201, sent.text
    body = sent.json()
    assert body["status"] == "relayed" and "relay" in body["result"]
    [frame] = wait_inbox(fed.c, carol)
    assert frame["text"] == secret
    assert frame["trust"] == "relay-verified" and frame["delivery_tier"] == "relay"
    fed.c.call("POST", "inbox/ack", carol["token"], {"ids": [frame["id"]]})
    wait_state(fed.b, bob, body["id"], "read", timeout=30)
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
    assert wait_inbox(fed.b, dup_b)[0]["delivery_tier"] == "channel"
    fed.b.call("DELETE", "sessions/me", dup_b["token"])
    time.sleep(1.2)  # past the hosts cache
    second = fed.a.send(alice, "dup", "and now?", idempotency_key="dup-2")
    assert second.status_code == 201, second.text
    assert wait_inbox(fed.c, dup_c)[0]["delivery_tier"] == "lan"

    # Only a relay-reachable copy left: a hub (this test's key) that leases the name at the relay.
    fed.c.call("DELETE", "sessions/me", dup_c["token"])
    fed.a.operator_token()  # minted now: it takes longer than the relay's 5 s leases here
    far = HubKey("far-hub")
    wait_until(
        lambda: far.take_lease(fed.r, "dup").status_code == 200,
        timeout=15,
        what="C's lease on dup to lapse",
        interval=0.5,
    )
    time.sleep(1.2)  # past the hosts cache
    # A seals only to a key its operator pinned: the relay naming an unknown one gets nothing.
    unpinned = fed.a.send(alice, "dup", "not to a key A never pinned", idempotency_key="dup-3a")
    assert unpinned.status_code == 201, unpinned.text
    failed = wait_state(fed.a, alice, unpinned.json()["id"], "failed")
    assert "no operator of this hub pinned" in failed["deliveries"][0]["remote"]["last_error"]
    assert far.pull(fed.r, ["dup"]).json()["messages"] == []
    fed.a.pin(far.public_key, name="far-hub", tier="relay")
    assert far.take_lease(fed.r, "dup").status_code == 200  # (5 s leases)
    third = fed.a.send(alice, "dup", "and via the relay?", idempotency_key="dup-3")
    assert third.status_code == 201, third.text
    assert third.json()["status"] == "relayed"
    items = wait_until(
        lambda: far.pull(fed.r, ["dup"]).json()["messages"],
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
    fed.b.pin(tester.public_key, name="tester")  # vouched for, so delivered rather than held
    bob = fed.b.register("bob-dup", cwd="/w/bd")
    envelope = tester.envelope(to="bob-dup", text="once only", dest=fed.b.public_key())
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
    [frame] = wait_inbox(fed.b, bob)
    [kept] = frame["files"]
    assert kept["sha256"] == hashlib.sha256(data).hexdigest()
    assert Path(kept["path"]).read_bytes() == data
    assert "/home/alice" not in kept["path"]

    tester = HubKey()
    fed.b.pin(tester.public_key, name="tester")  # vouched for, so delivered rather than held
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
        {
            "tier": "lan",
            "envelope": tester.envelope(
                to="filer", text="tampered file", files=[bad], dest=fed.b.public_key()
            ),
        },
    )
    assert response.status_code == 201, response.text
    [frame] = wait_inbox(fed.b, bob)
    assert "FILES=0" in frame["marker"]
    assert "mismatch" in frame["files"][0]["problem"]


def test_lease_is_exclusive(fed):
    intruder = HubKey("intruder")
    assert intruder.take_lease(fed.r, "carol").status_code == 409
    assert (
        intruder.call(fed.r, "POST", "relay/claims", {"agent": "carol", "kind": "message"}).status_code == 409
    )
    assert intruder.take_lease(fed.r, "someone-new").status_code == 200


def test_a_lease_carries_its_hubs_statement_and_one_without_is_refused(fed):
    """C's lease on carol is kept at the relay with C's own signed statement for carol and this
    relay, which the relay hands to whoever asks where carol is (what B checks before it seals to
    C); a lease asked for without one, as an older hub asks, is refused and leases nothing."""
    asker = HubKey("asker")
    found = asker.call(fed.r, "GET", "relay/agents?to=carol").json()
    statement = found["statement"]
    c_key, r_key = fed.c.public_key(), fed.r.public_key()
    assert (found["hub_key"], statement["hub"], statement["agent"], statement["relay"]) == (
        c_key,
        c_key,
        "carol",
        r_key,
    )
    assert statement["issued_at"] <= time.time() + 30 < statement["valid_until"] + 30
    older = HubKey("older-hub")
    refused = older.call(fed.r, "POST", "relay/leases", {"agent": "older-agent"})
    assert (refused.status_code, refused.json()["error"]) == (400, "bad_lease_statement"), refused.text
    assert asker.call(fed.r, "GET", "relay/agents?to=older-agent").json() == {"hosted": False}


def _seal(public_key: str, payload: bytes) -> str:
    from nacl.signing import VerifyKey

    curve = VerifyKey(base64.b64decode(public_key)).to_curve25519_public_key()
    return base64.b64encode(SealedBox(PublicKey(bytes(curve))).encrypt(payload)).decode()


def test_claims_are_atomic_between_concurrent_pullers(fed):
    owner = HubKey("puller")
    agent = f"worker-{uuid.uuid4().hex[:6]}"
    assert owner.take_lease(fed.r, agent).status_code == 200
    ids = set()
    for i in range(30):
        mid = str(uuid.uuid4())
        ids.add(mid)
        owner.take_lease(fed.r, agent)  # leases here last 5 s: keep it
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
                response = who.pull(fed.r, [agent])
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
        log = fed.c.server.log.read_text()
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
    fed.b.pin(tester.public_key, name="far-away")  # B vouches for the origin; A (registry) carries
    bob = fed.b.register("bob-onward", cwd="/w/bo")
    onward = tester.call(
        fed.a,
        "POST",
        "federation/messages",
        # Sent to A (signed for A's key), which carries it onward to B.
        {"tier": "lan", "envelope": tester.envelope(to="bob-onward", text="via A", dest=fed.a.public_key())},
    )
    assert onward.status_code == 201, onward.text
    [frame] = wait_inbox(fed.b, bob)
    assert frame["text"] == "via A" and frame["trust"] == "channel-verified"
    capped = tester.envelope(to="bob-onward", text="no further", hops=3)
    assert (
        tester.call(fed.a, "POST", "federation/messages", {"tier": "lan", "envelope": capped}).status_code
        == 404
    )
    assert fed.b.inbox(bob) == []
