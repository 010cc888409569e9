"""The relay role: leases, atomic claims, release, expiry, refusing names nobody hosts, and what
a caller holding nothing but a home-made hub key (trust on first use is on by default, so the
relay serves it) can do to other hubs' messages and receipts."""

from __future__ import annotations

import base64
import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from nacl.signing import SigningKey

from federation.errors import LeaseHeld, NotRelay
from federation.models import RelayMessage
from federation.services.relay import (
    relay_claim,
    relay_claim_finish,
    relay_expire,
    relay_lease_take,
    relay_lookup,
    relay_store,
)
from messaging.errors import NotFound
from tests.federation.conftest import OtherHub

A, B = "hub-a-key", "hub-b-key"
RELAY = "/api/v1/relay"


@pytest.fixture
def relay(settings, db):
    settings.SWITCHBOARD_ROLE = "relay"


def _store(agent="carol", dest=A, **kw):
    return relay_store(
        from_hub="sender",
        kind="message",
        message_id=str(uuid.uuid4()),
        dest_hub=dest,
        agent=agent,
        sealed=base64.b64encode(b"opaque").decode(),
        **kw,
    )[0]


def test_only_a_relay_answers(db, settings):
    settings.SWITCHBOARD_ROLE = "hub"
    with pytest.raises(NotRelay):
        relay_lookup(target="carol")


def test_a_lease_is_exclusive_until_it_lapses(relay):
    relay_lease_take(hub_key=A, agent="Carol")
    relay_lease_take(hub_key=A, agent="carol")  # renewal by the holder
    with pytest.raises(LeaseHeld):
        relay_lease_take(hub_key=B, agent="carol")
    later = timezone.now() + timedelta(hours=1)
    assert relay_lease_take(hub_key=B, agent="carol", now=later).hub_key == B


def test_messages_for_a_name_nobody_leases_are_refused(relay):
    with pytest.raises(NotFound):
        _store(agent="ghost")


def test_pulls_need_the_lease_and_each_message_is_claimed_once(relay):
    relay_lease_take(hub_key=A, agent="carol")
    stored = {str(_store().message_id) for _ in range(5)}
    with pytest.raises(LeaseHeld):
        relay_claim(hub_key=B, agent="carol")
    first = relay_claim(hub_key=A, agent="carol", limit=3)
    second = relay_claim(hub_key=A, agent="carol", limit=10)
    assert len(first) == 3 and len(second) == 2
    assert {c["message_id"] for c in first + second} == stored
    assert relay_claim(hub_key=A, agent="carol") == []


def test_a_released_claim_comes_back_and_a_done_one_loses_its_ciphertext(relay):
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    [claim] = relay_claim(hub_key=A, agent="carol")
    assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="release")
    [again] = relay_claim(hub_key=A, agent="carol")
    assert again["id"] == claim["id"]
    assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="done")
    row = RelayMessage.objects.get(pk=claim["id"])
    assert row.done and bytes(row.sealed) == b""
    assert relay_claim(hub_key=A, agent="carol") == []


def test_an_expired_claim_can_be_claimed_again(relay, settings):
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    [claim] = relay_claim(hub_key=A, agent="carol")
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_CLAIM_SECONDS + 1)
    relay_lease_take(hub_key=A, agent="carol", now=later)
    [again] = relay_claim(hub_key=A, agent="carol", now=later)
    assert again["id"] == claim["id"]


def test_messages_expire(relay, settings):
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    assert relay_expire() == 0
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_EXPIRY_SECONDS + 1)
    assert relay_expire(now=later) == 1
    assert not RelayMessage.objects.exists()


def test_storing_the_same_message_twice_keeps_one(relay):
    relay_lease_take(hub_key=A, agent="carol")
    mid = str(uuid.uuid4())
    sealed = base64.b64encode(b"x").decode()
    _, created = relay_store(
        from_hub="s", kind="message", message_id=mid, dest_hub=A, agent="carol", sealed=sealed
    )
    _, again = relay_store(
        from_hub="s", kind="message", message_id=mid, dest_hub=A, agent="carol", sealed=sealed
    )
    assert (created, again) == (True, False)
    assert RelayMessage.objects.count() == 1


def test_one_pull_renews_leases_claims_messages_and_reports_names_held_elsewhere(relay):
    from federation.services.relay import relay_claims_finish, relay_pull

    relay_lease_take(hub_key=B, agent="dave")
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    answer = relay_pull(hub_key=A, agents=["carol", "dave", "carol"])
    assert answer["leases"] == {"carol": "ok", "dave": "held_elsewhere"}
    [claim] = answer["messages"]
    assert relay_pull(hub_key=A, agents=["carol"])["messages"] == []
    assert relay_claims_finish(hub_key=A, done=[], release=[claim["id"]]) == 1
    assert [m["id"] for m in relay_pull(hub_key=A, agents=["carol"])["messages"]] == [claim["id"]]
    assert relay_claims_finish(hub_key=B, done=[claim["id"]], release=[]) == 0  # not B's claim


# --- a home-made key at the relay ------------------------------------------------------------------


@pytest.fixture
def hubs() -> dict[str, OtherHub]:
    """Three hubs that call the relay: A (a message's origin), B (its recipient's hub) and
    mallory, a key made at home that the relay has never seen before."""
    return {
        "a": OtherHub(SigningKey.generate(), name="a-hub"),
        "b": OtherHub(SigningKey.generate(), name="b-hub"),
        "mallory": OtherHub(SigningKey.generate(), name="mallory"),
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _ok(response: Any) -> Any:
    assert response.status_code in (200, 201), (response.status_code, response.json_body)
    return response.json_body


def _receipt(message_id: str, dest: str, sealed: bytes) -> dict[str, Any]:
    """A receipt batch as `receipts_flush` stores it at the relay."""
    return {
        "kind": "receipt",
        "message_id": message_id,
        "dest_hub": dest,
        "agent": "",
        "sealed": _b64(sealed),
        "replace": True,
    }


def test_a_stranger_cannot_replace_another_hubs_receipt_batch_at_the_relay(
    relay: None, hubs: dict[str, OtherHub], hub_client: Any
) -> None:
    """Given A sent bob@B a message through the relay, and B stored its receipt batch for A under
    that message's id (no secret: bob's frame carries it); when Mallory stores a "receipt" under
    the same id for A with `replace: true`, then B's batch keeps its `from_hub` and its ciphertext,
    and A's pull still gets it (Mallory's bytes come as an item of their own, which A's hub cannot
    open and drops). B replacing its own batch still works."""
    a, b, mallory = hubs["a"], hubs["b"], hubs["mallory"]
    _ok(b.call(hub_client, "POST", f"{RELAY}/leases", {"agent": "bob"}))
    stored = {
        "message_id": str(uuid.uuid4()),
        "dest_hub": b.public_key,
        "agent": "bob",
        "sealed": _b64(b"to-b"),
    }
    _ok(a.call(hub_client, "POST", f"{RELAY}/messages", stored))
    [item] = _ok(b.call(hub_client, "POST", f"{RELAY}/pull", {"agents": ["bob"]}))["messages"]
    known_id = item["message_id"]
    _ok(b.call(hub_client, "POST", f"{RELAY}/claims/finish", {"done": [item["id"]], "release": []}))
    _ok(b.call(hub_client, "POST", f"{RELAY}/messages", _receipt(known_id, a.public_key, b"B: delivered")))
    _ok(b.call(hub_client, "POST", f"{RELAY}/messages", _receipt(known_id, a.public_key, b"B: read")))

    mallory.call(hub_client, "POST", f"{RELAY}/messages", _receipt(known_id, a.public_key, b"garbage"))

    row = RelayMessage.objects.get(kind="receipt", message_id=known_id, from_hub=b.public_key)
    assert (row.dest_hub, bytes(row.sealed)) == (a.public_key, b"B: read")
    receipts = _ok(a.call(hub_client, "POST", f"{RELAY}/pull", {"agents": []}))["receipts"]
    by_storer = {r["from_hub"]: base64.b64decode(r["sealed"]) for r in receipts}
    assert by_storer[b.public_key] == b"B: read"


def test_a_stranger_storing_first_under_a_message_id_does_not_block_the_real_hub(relay: None) -> None:
    """Given Mallory stored a message and a receipt under ids she learnt early, when the real
    hubs store theirs under the same ids, then each is kept as its own row (not a no-op answered
    with Mallory's row) and the real one reaches its puller."""
    relay_lease_take(hub_key=B, agent="bob")
    mid = str(uuid.uuid4())
    for kind, agent, dest in (("message", "bob", B), ("receipt", "", A)):
        relay_store(
            from_hub="mallory", kind=kind, message_id=mid, dest_hub=dest, agent=agent, sealed=_b64(b"x")
        )
        row, created = relay_store(
            from_hub="real", kind=kind, message_id=mid, dest_hub=dest, agent=agent, sealed=_b64(b"real")
        )
        assert created and row.from_hub == "real"
    pulled = relay_claim(hub_key=B, agent="bob") + relay_claim(hub_key=A, kind="receipt")
    assert sorted(base64.b64decode(c["sealed"]) for c in pulled) == [b"real", b"real", b"x", b"x"]


def test_a_stranger_cannot_park_a_receipt_batch_far_larger_than_any_receipts_at_the_relay(
    relay: None, hubs: dict[str, OtherHub], hub_client: Any
) -> None:
    """A receipt needs no lease and may name any destination key (read off `/relay/agents`).
    Given the largest batch a hub makes is tens of kB, when Mallory stores a 2 MB "receipt" for
    A, then the relay answers 413 saying so and keeps nothing."""
    a, mallory = hubs["a"], hubs["mallory"]
    response = mallory.call(
        hub_client,
        "POST",
        f"{RELAY}/messages",
        _receipt(str(uuid.uuid4()), a.public_key, os.urandom(2 << 20)),
    )
    assert response.status_code == 413, (response.status_code, response.json_body)
    assert response.json_body["error"] == "too_large"
    assert "receipt batch" in response.json_body["detail"]
    assert not RelayMessage.objects.filter(kind="receipt").exists()


def test_the_largest_receipt_batch_a_hub_makes_fits_the_relays_cap_with_room_to_spare(
    relay: None, settings: Any
) -> None:
    """Given a flush carries at most RECEIPTS_PER_BATCH receipts, when a hub seals a full batch
    of the longest state's receipts as it does for the relay, then it is under a quarter of the
    relay's receipt cap, and the relay keeps it."""
    from federation.services.receipts import RECEIPTS_PER_BATCH, receipts_sealed_for_relay
    from messaging.states import DeliveryState

    longest = max((state.value for state in DeliveryState), key=len)
    receipts = [{"message_id": str(uuid.uuid4()), "state": longest} for _ in range(RECEIPTS_PER_BATCH)]
    sealed = receipts_sealed_for_relay(
        origin_hub=OtherHub(SigningKey.generate()).public_key, receipts=receipts
    )
    assert len(sealed) < settings.SWITCHBOARD_RELAY_RECEIPT_MAX_BYTES / 4, len(sealed)
    _, created = relay_store(
        from_hub=B,
        kind="receipt",
        message_id=receipts[0]["message_id"],
        dest_hub=A,
        agent="",
        sealed=_b64(sealed),
    )
    assert created
