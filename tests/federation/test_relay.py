"""The relay role: leases, atomic claims, release, expiry, refusing names nobody hosts, and what
a caller holding nothing but a home-made hub key (trust on first use is on by default, so the
relay serves it) can do to other hubs' messages and receipts."""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone
from nacl.signing import SigningKey

from federation.errors import LeaseHeld, NotRelay
from federation.models import RelayMessage, RelayStorer
from federation.services.relay import (
    RELEASED_WAIT,
    relay_claim,
    relay_claim_finish,
    relay_expire,
    relay_lease_take,
    relay_lookup,
    relay_pull,
    relay_store,
)
from messaging.errors import NotFound
from tests.federation.conftest import OtherHub

LEASING = {hub.public_key: hub for hub in (OtherHub(SigningKey.generate()), OtherHub(SigningKey.generate()))}
A, B = LEASING
RELAY = "/api/v1/relay"


def _lease(hub_key: str, agent: str, *, now: Any = None) -> Any:
    """The hub holding `hub_key` (A or B) takes or renews its lease on `agent`, with its statement."""
    stamp = None if now is None else now.timestamp()
    statement = LEASING[hub_key].lease(agent, now=stamp)
    return relay_lease_take(hub_key=hub_key, agent=agent, statement=statement, now=now)


def _pull(hub_key: str, agents: list[str]) -> dict[str, Any]:
    """One pull cycle of the hub holding `hub_key` (A or B), each lease with its statement."""
    hub = LEASING[hub_key]
    return relay_pull(hub_key=hub_key, agents=agents, statements={a: hub.lease(a) for a in agents})


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
    _lease(A, "Carol")
    _lease(A, "carol")  # renewal by the holder
    with pytest.raises(LeaseHeld):
        _lease(B, "carol")
    later = timezone.now() + timedelta(hours=1)
    assert _lease(B, "carol", now=later).hub_key == B


def test_messages_for_a_name_nobody_leases_are_refused(relay):
    with pytest.raises(NotFound):
        _store(agent="ghost")


def test_pulls_need_the_lease_and_each_message_is_claimed_once(relay):
    _lease(A, "carol")
    stored = {str(_store().message_id) for _ in range(5)}
    with pytest.raises(LeaseHeld):
        relay_claim(hub_key=B, agent="carol")
    first = relay_claim(hub_key=A, agent="carol", limit=3)
    second = relay_claim(hub_key=A, agent="carol", limit=10)
    assert len(first) == 3 and len(second) == 2
    assert {c["message_id"] for c in first + second} == stored
    assert relay_claim(hub_key=A, agent="carol") == []


def test_a_released_claim_comes_back_after_a_wait_and_a_done_one_loses_its_ciphertext(relay):
    _lease(A, "carol")
    _store()
    [claim] = relay_claim(hub_key=A, agent="carol")
    assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="release")
    assert relay_claim(hub_key=A, agent="carol") == []  # it waits at least RELEASED_WAIT's shortest
    later = timezone.now() + RELEASED_WAIT[0] + timedelta(seconds=1)
    [again] = relay_claim(hub_key=A, agent="carol", now=later)
    assert again["id"] == claim["id"]
    assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="done")
    row = RelayMessage.objects.get(pk=claim["id"])
    assert row.done and bytes(row.sealed) == b""
    assert relay_claim(hub_key=A, agent="carol") == []


def test_messages_a_hub_keeps_releasing_never_keep_newer_ones_from_it(relay):
    """Given a full pull's worth of messages for an agent that its hub releases each time (a
    stranger's, refused here for now or failing every time), when a genuine message is stored
    after them, then the next pull takes it: a released message waits before it is offered again,
    longer the older it is, instead of heading the queue for its whole day at the relay."""
    _lease(A, "carol")
    stuck = {_store().id for _ in range(5)}
    genuine = _store()
    for _ in range(3):
        claimed = relay_claim(hub_key=A, agent="carol", limit=5)
        if genuine.id in {uuid.UUID(c["id"]) for c in claimed}:
            break
        assert {uuid.UUID(c["id"]) for c in claimed} == stuck
        for claim in claimed:
            assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="release")
    else:
        pytest.fail("the genuine message never came past the released ones")


def test_an_expired_claim_can_be_claimed_again(relay, settings):
    _lease(A, "carol")
    _store()
    [claim] = relay_claim(hub_key=A, agent="carol")
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_CLAIM_SECONDS + 1)
    _lease(A, "carol", now=later)
    [again] = relay_claim(hub_key=A, agent="carol", now=later)
    assert again["id"] == claim["id"]


def test_messages_expire(relay, settings):
    _lease(A, "carol")
    _store()
    assert relay_expire() == 0
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_EXPIRY_SECONDS + 1)
    assert relay_expire(now=later) == 1
    assert not RelayMessage.objects.exists()
    assert not RelayStorer.objects.exists()  # its key keeps nothing here any more


def test_storing_the_same_message_twice_keeps_one(relay):
    _lease(A, "carol")
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
    from federation.services.relay import relay_claims_finish

    _lease(B, "dave")
    _lease(A, "carol")
    _store()
    answer = _pull(A, ["carol", "dave", "carol"])
    assert answer["leases"] == {"carol": "ok", "dave": "held_elsewhere"}
    [claim] = answer["messages"]
    assert _pull(A, ["carol"])["messages"] == []
    assert relay_claims_finish(hub_key=A, done=[], release=[claim["id"]]) == 1
    assert _pull(A, ["carol"])["messages"] == []  # released: it waits a while
    with time_machine.travel(timezone.now() + RELEASED_WAIT[0] + timedelta(seconds=1), tick=False):
        assert [m["id"] for m in _pull(A, ["carol"])["messages"]] == [claim["id"]]
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
    _ok(b.call(hub_client, "POST", f"{RELAY}/leases", {"agent": "bob", "statement": b.lease("bob")}))
    stored = {
        "message_id": str(uuid.uuid4()),
        "dest_hub": b.public_key,
        "agent": "bob",
        "sealed": _b64(b"to-b"),
    }
    _ok(a.call(hub_client, "POST", f"{RELAY}/messages", stored))
    [item] = _ok(
        b.call(
            hub_client, "POST", f"{RELAY}/pull", {"agents": ["bob"], "statements": {"bob": b.lease("bob")}}
        )
    )["messages"]
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
    _lease(B, "bob")
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


@pytest.fixture
def small_relay(relay: None, settings: Any) -> Any:
    """A relay with its byte limits lowered so the tests store hundreds of bytes, not megabytes:
    one pull answer carries 1000 sealed bytes, one storing key keeps 2500 bytes and 5 items."""
    settings.SWITCHBOARD_RELAY_PULL_MAX_BYTES = 1000
    settings.SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB = 2500
    settings.SWITCHBOARD_RELAY_PENDING_PER_HUB = 5
    return settings


def _stored(from_hub: str, size: int, *, agent: str = "carol", dest: str = B, kind: str = "message") -> str:
    row, _ = relay_store(
        from_hub=from_hub,
        kind=kind,
        message_id=str(uuid.uuid4()),
        dest_hub=dest,
        agent=agent if kind == "message" else "",
        sealed=_b64(os.urandom(size)),
    )
    return str(row.id)


def _answer_bytes(answer: dict[str, Any]) -> int:
    return sum(len(base64.b64decode(i["sealed"])) for i in answer["messages"] + answer["receipts"])


def test_a_strangers_stored_messages_cannot_make_another_hubs_pull_answer_unbounded(small_relay: Any) -> None:
    """B leases `carol`. Mallory (a home-made key: anyone may send to a leased name) stores large
    sealed "messages" for carol. Given one key keeps at most 2500 bytes waiting, when Mallory
    stores a third 900-byte message, then the relay refuses it (429 `relay_quota`); and given one
    answer carries at most 1000 bytes, B's pull takes one of the two, says more waits, and the
    next pull takes the other. (At full size: four 75 MB messages no longer make one 400 MB
    answer that fails and comes back for 24 h.)"""
    from federation.errors import RelayQuotaFull

    _lease(B, "carol")
    first, second = _stored("mallory", 900), _stored("mallory", 900)
    with pytest.raises(RelayQuotaFull) as refused:
        _stored("mallory", 900)
    assert refused.value.status == 429 and refused.value.extra["limit_bytes"] == 2500

    answers = [_pull(B, ["carol"]) for _ in range(3)]

    assert [[m["id"] for m in a["messages"]] for a in answers] == [[first], [second], []]
    assert [a["more"] for a in answers] == [True, False, False]
    assert all(_answer_bytes(a) <= small_relay.SWITCHBOARD_RELAY_PULL_MAX_BYTES for a in answers)


def test_one_pull_answer_fills_its_byte_budget_in_order_and_leaves_the_rest_for_the_next(
    small_relay: Any,
) -> None:
    """Given six 300-byte messages for carol from six hubs (no key near its quota), when B pulls
    three times, then each answer carries what fits in 1000 bytes, oldest first (3, 3, 0), and
    says whether more waits."""
    _lease(B, "carol")
    ids = [_stored(f"hub-{n}", 300) for n in range(6)]
    answers = [_pull(B, ["carol"]) for _ in range(3)]
    assert [m["id"] for a in answers for m in a["messages"]] == ids
    assert [(len(a["messages"]), a["more"]) for a in answers] == [(3, True), (3, False), (0, False)]


def test_a_message_larger_than_the_whole_budget_still_goes_alone_and_receipts_still_ride(
    small_relay: Any,
) -> None:
    """Given a 2000-byte message (twice the answer's budget), a small one behind it, and a receipt
    batch for B, when B pulls, then the large message goes alone with the receipt batch (the
    first of each kind always goes) and the small one comes next pull."""
    small_relay.SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB = 10_000
    _lease(B, "carol")
    large, small = _stored("a", 2000), _stored("a", 10)
    receipt = _stored("c", 50, kind="receipt")
    first = _pull(B, ["carol"])
    assert ([m["id"] for m in first["messages"]], [r["id"] for r in first["receipts"]]) == (
        [large],
        [receipt],
    )
    assert first["more"]
    assert [m["id"] for m in _pull(B, ["carol"])["messages"]] == [small]


def test_what_one_key_keeps_waiting_is_bounded_in_count_too_and_frees_once_pulled(
    small_relay: Any, hubs: dict[str, OtherHub], hub_client: Any
) -> None:
    """Given Mallory keeps five small receipt batches waiting (no lease needed), when she stores a
    sixth, then the relay answers 429 `relay_quota` saying why; once the destination pulled them
    and finished its claims, she may store again."""
    a, mallory = hubs["a"], hubs["mallory"]
    for _ in range(5):
        _ok(
            mallory.call(
                hub_client, "POST", f"{RELAY}/messages", _receipt(str(uuid.uuid4()), a.public_key, b"r")
            )
        )
    refused = mallory.call(
        hub_client, "POST", f"{RELAY}/messages", _receipt(str(uuid.uuid4()), a.public_key, b"r")
    )
    assert refused.status_code == 429, (refused.status_code, refused.json_body)
    assert refused.json_body["error"] == "relay_quota" and "5 items waiting" in refused.json_body["detail"]

    pulled = _ok(a.call(hub_client, "POST", f"{RELAY}/pull", {"agents": []}))["receipts"]
    _ok(
        a.call(
            hub_client, "POST", f"{RELAY}/claims/finish", {"done": [r["id"] for r in pulled], "release": []}
        )
    )
    _ok(
        mallory.call(hub_client, "POST", f"{RELAY}/messages", _receipt(str(uuid.uuid4()), a.public_key, b"r"))
    )


def test_a_key_at_its_quota_may_repeat_a_store_and_replace_its_receipt_batch(small_relay: Any) -> None:
    """Given a key keeps its 5 items, when it stores one of them again (a retry whose answer was
    lost) or replaces its receipt batch, then the relay answers with the row it keeps, as neither
    adds an item; a sixth item is refused."""
    from federation.errors import RelayQuotaFull

    _lease(B, "carol")
    mid = str(uuid.uuid4())
    first, created = relay_store(
        from_hub="a", kind="message", message_id=mid, dest_hub=B, agent="carol", sealed=_b64(b"m")
    )
    batch, _ = relay_store(
        from_hub="a", kind="receipt", message_id=mid, dest_hub=B, agent="", sealed=_b64(b"r1")
    )
    for _ in range(3):
        _stored("a", 10)
    again, repeated = relay_store(
        from_hub="a", kind="message", message_id=mid, dest_hub=B, agent="carol", sealed=_b64(b"m")
    )
    replaced, _ = relay_store(
        from_hub="a", kind="receipt", message_id=mid, dest_hub=B, agent="", sealed=_b64(b"r2"), replace=True
    )
    assert (created, repeated, again.pk, replaced.pk) == (True, False, first.pk, batch.pk)
    assert bytes(RelayMessage.objects.get(pk=batch.pk).sealed) == b"r2"
    with pytest.raises(RelayQuotaFull):
        _stored("a", 10)


def test_the_default_limits_keep_one_pull_answer_under_what_a_hub_accepts_as_a_body(settings: Any) -> None:
    """One answer is at most max(budget, the largest message) plus one receipt batch (and a
    count-bounded JSON frame around them): as base64 it stays under the 280 MB cap of a hub body."""
    from federation.api import MAX_HUB_BODY
    from federation.services.relay import MAX_SEALED_BYTES

    largest = max(settings.SWITCHBOARD_RELAY_PULL_MAX_BYTES, MAX_SEALED_BYTES)
    worst = (largest + settings.SWITCHBOARD_RELAY_RECEIPT_MAX_BYTES) * 4 // 3 + 1024 * 1024
    assert worst < MAX_HUB_BODY


def test_a_relay_with_first_use_off_serves_only_the_keys_its_operator_pinned(
    relay: None, settings: Any, hubs: dict[str, OtherHub], hub_client: Any
) -> None:
    """What closes a relay to home-made keys: SWITCHBOARD_PEER_TOFU=0 on the relay. Given it,
    when a key nobody pinned there stores or pulls, then it is refused (403 `peer_unknown`) and
    nothing is kept; a key its operator pinned is served."""
    from tests.federation.conftest import pin_hub

    settings.SWITCHBOARD_PEER_TOFU = False
    a, mallory = hubs["a"], hubs["mallory"]
    pin_hub(a, "lan")
    for path, body in (
        ("messages", _receipt(str(uuid.uuid4()), a.public_key, b"r")),
        ("pull", {"agents": []}),
    ):
        refused = mallory.call(hub_client, "POST", f"{RELAY}/{path}", body)
        assert (refused.status_code, refused.json_body["error"]) == (403, "peer_unknown")
    assert not RelayMessage.objects.exists()
    _ok(a.call(hub_client, "POST", f"{RELAY}/pull", {"agents": []}))


# --- the hub side of the pull -------------------------------------------------------------------------


def _fake_relay(monkeypatch: pytest.MonkeyPatch, settings: Any, answers: list[dict[str, Any]]) -> list[str]:
    """The relay as the hub sees it: each pull gets the next of `answers` (the last one repeats);
    returns the paths the hub called."""
    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key
    called: list[str] = []

    def relay_answers(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        called.append(path)
        if path == "/relay/pull":
            pulls = called.count("/relay/pull")
            return answers[min(pulls, len(answers)) - 1]
        return {}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)
    return called


def _pull_answer(*, more: bool, messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"leases": {}, "messages": messages or [], "receipts": [], "more": more}


def test_a_hub_pulls_again_at_once_while_the_relay_holds_items_back(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the relay says more waits twice and then not, when the hub runs one pull cycle, then
    it pulls three times in that cycle."""
    from federation.services.relay import relay_pull_once

    called = _fake_relay(
        monkeypatch, settings, [_pull_answer(more=True), _pull_answer(more=True), _pull_answer(more=False)]
    )
    relay_pull_once(sessions=[])
    assert called.count("/relay/pull") == 3


def test_a_hubs_pull_cycle_is_bounded_whatever_the_relay_says(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a relay that always says more waits, when the hub runs one pull cycle, then it stops
    after PULL_ROUNDS_PER_CYCLE pulls (the next cycle goes on), also when each round has to release
    what it took (a relay that offers it straight back gets it back at most that often)."""
    from federation.services.relay import PULL_ROUNDS_PER_CYCLE, relay_pull_once

    called = _fake_relay(monkeypatch, settings, [_pull_answer(more=True)])
    relay_pull_once(sessions=[])
    assert called.count("/relay/pull") == PULL_ROUNDS_PER_CYCLE

    broken = {
        "id": str(uuid.uuid4()),
        "message_id": str(uuid.uuid4()),
        "from_hub": "x",
        "sealed": "not base64!",
    }
    called = _fake_relay(monkeypatch, settings, [_pull_answer(more=True, messages=[broken])])
    counts = relay_pull_once(sessions=[])
    assert (called.count("/relay/pull"), counts["released"]) == (PULL_ROUNDS_PER_CYCLE, PULL_ROUNDS_PER_CYCLE)


# --- the quota under concurrent stores ---------------------------------------------------------------


def _stores_at_once(*, stores: int, from_hub: str, dest: str) -> list[str]:
    """`stores` receipt batches from one key, stored by as many threads released together; each
    thread's outcome: `kept`, `refused` (429 `relay_quota`) or `error:...`."""
    from django.db import connection

    from federation.errors import RelayQuotaFull

    barrier = threading.Barrier(stores)
    outcomes: list[str] = []

    def store() -> None:
        try:
            barrier.wait(timeout=30)
            relay_store(
                from_hub=from_hub,
                kind="receipt",
                message_id=str(uuid.uuid4()),
                dest_hub=dest,
                agent="",
                sealed=_b64(b"r" * 100),
            )
            outcomes.append("kept")
        except RelayQuotaFull:
            outcomes.append("refused")
        except Exception as exc:  # counted, never hidden: the test fails on any error
            outcomes.append(f"error:{type(exc).__name__}:{exc}"[:200])
        finally:
            connection.close()  # this thread's own

    threads = [threading.Thread(target=store) for _ in range(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_concurrent_stores_of_one_key_never_pass_its_quota(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given one key may keep 3 items (and 300 bytes) waiting, when 8 threads store one item each
    for it at once, each on a connection of its own (PostgreSQL, or SQLite as `serve` runs it),
    with the time between counting what the key keeps and writing the new item stretched (as a
    loaded database would), then exactly 3 are kept and 5 refused."""
    from federation.services import relay

    settings.SWITCHBOARD_ROLE = "relay"
    settings.SWITCHBOARD_RELAY_PENDING_PER_HUB = 3
    settings.SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB = 300
    counted = relay._pending_check

    def slow_count(**kw: Any) -> None:
        counted(**kw)
        time.sleep(0.2)

    monkeypatch.setattr(relay, "_pending_check", slow_count)

    outcomes = _stores_at_once(stores=8, from_hub="mallory", dest=A)

    assert sorted(outcomes) == ["kept"] * 3 + ["refused"] * 5, outcomes
    kept = RelayMessage.objects.filter(from_hub="mallory")
    assert (kept.count(), sum(kept.values_list("size", flat=True))) == (3, 300)
