"""Loop protection: dedupe, the per-pair and hub-wide buckets, the unread cap, loop detection,
and a measured two-agent reply loop that the hub stops."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from messaging.models import Delivery
from messaging.services.limits import MemoryBuckets, RedisBuckets, Want, gcra
from tests.local_redis import local_redis_url


@pytest.fixture(autouse=True)
def _own_limit_keys(settings):
    """Each test gets its own key space, so the hub-wide bucket starts full."""
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-limits-{uuid.uuid4().hex}"


def test_identical_text_within_the_window_returns_the_original(api, register, send):
    alice, bob, carol = register("alice"), register("bob"), register("carol")
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        first = send(alice, "bob", "build is green").json_body
    with time_machine.travel(start + timedelta(seconds=59), tick=False):
        again = send(alice, "bob", "build is green")
        assert again.status_code == 201
        assert again.json_body["id"] == first["id"] and again.json_body["duplicate"] is True
        assert again.json_body["status"] == "queued"
        # Same text to someone else, or from someone else, is a new message.
        assert send(alice, "carol", "build is green").json_body["duplicate"] is False
        assert send(carol, "bob", "build is green").json_body["duplicate"] is False
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        later = send(alice, "bob", "build is green").json_body
    assert later["id"] != first["id"] and later["duplicate"] is False
    assert Delivery.objects.filter(recipient_id=bob.id).count() == 3


def test_a_duplicate_reports_the_originals_current_state(api, register, send):
    alice, bob = register("alice"), register("bob")
    mid = send(alice, "bob", "done").json_body["id"]
    api.get("inbox", bob.token)
    api.post("inbox/ack", bob.token, {"ids": [mid]})
    again = send(alice, "bob", "done").json_body
    assert (again["id"], again["status"], again["duplicate"]) == (mid, "read", True)


def test_pair_bucket_allows_a_burst_then_one_per_interval(api, register, send, settings):
    settings.SWITCHBOARD_RATE_PAIR, settings.SWITCHBOARD_RATE_PAIR_SECONDS = 10, 10
    alice, bob, carol = register("alice"), register("bob"), register("carol")
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        assert all(send(alice, "bob", f"m{i}").status_code == 201 for i in range(10))
        r = send(alice, "bob", "m10")
        assert r.status_code == 429
        assert (r.json_body["error"], r.json_body["reason"]) == ("rate_limited", "pair_rate")
        assert r.json_body["retry_after"] == 1 and "wait 1 s" in r.json_body["detail"]
        assert send(carol, "bob", "other pair").status_code == 201  # keyed by sender→recipient
        assert send(bob, "alice", "reverse pair").status_code == 201
    with time_machine.travel(start + timedelta(seconds=1.01), tick=False):
        assert send(alice, "bob", "m11").status_code == 201
        assert send(alice, "bob", "m12").status_code == 429


def test_hub_wide_bucket(api, register, send, settings):
    settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS = 3, 10
    alice, bob, carol = register("alice"), register("bob"), register("carol")
    with time_machine.travel(timezone.now(), tick=False):
        assert send(alice, "bob", "1").status_code == 201
        assert send(bob, "carol", "2").status_code == 201
        assert send(carol, "alice", "3").status_code == 201
        r = send(alice, "carol", "4")
    assert r.status_code == 429 and r.json_body["reason"] == "hub_rate"


def test_unread_cap_per_recipient_with_a_sentence(api, register, send, settings):
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 5
    alice, carol, bob = register("alice"), register("carol"), register("bob")
    for i in range(3):
        send(alice, "bob", f"a{i}")
    for i in range(2):
        send(carol, "bob", f"c{i}")
    r = send(alice, "bob", "one more")
    assert r.status_code == 429 and r.json_body["reason"] == "recipient_queue_full"
    assert "inbox is full" in r.json_body["detail"] and "(5)" in r.json_body["detail"]
    assert "Wait" in r.json_body["detail"]
    # Pulled but not acknowledged is still unread; acknowledged makes room.
    pulled = api.get("inbox", bob.token).json_body["messages"]
    assert send(alice, "bob", "still full").status_code == 429
    api.post("inbox/ack", bob.token, {"ids": [pulled[0]["id"]]})
    assert send(alice, "bob", "now it fits").status_code == 201


def test_a_reply_loop_is_held_for_an_operator(api, register, send, settings, operator_token):
    settings.SWITCHBOARD_LOOP_EXCHANGES = 3
    alice, bob = register("alice"), register("bob")
    for i in range(3):
        assert send(alice, "bob", f"ping {i}").json_body["status"] == "queued"
        assert send(bob, "alice", f"pong {i}").json_body["status"] == "queued"
    r = send(alice, "bob", "ping 3")
    assert r.json_body["status"] == "held" and "reply loop" in r.json_body["result"]
    [hold] = api.get("holds", operator_token).json_body["holds"]
    assert hold["hold_reason"] == "loop_suspected"
    assert send(bob, "alice", "pong 3").json_body["status"] == "held"
    # A one-way stream is not a loop.
    carol = register("carol")
    assert all(send(carol, "bob", f"report {i}").json_body["status"] == "queued" for i in range(5))
    # An operator who allows this sender for this recipient has looked: no more loop holds there.
    api.call("PUT", f"sessions/{bob.id}/senders/{alice.id}", operator_token, {"action": "accept"})
    assert send(alice, "bob", "ping 4").json_body["status"] == "queued"
    assert send(bob, "alice", "pong 4").json_body["status"] == "held"  # the other direction is not allowed


def test_gcra_is_a_token_bucket():
    tat, wait = None, 0.0
    for _ in range(10):
        tat, wait = gcra(tat, 10, 10.0, 100.0)
        assert wait == 0
    _, wait = gcra(tat, 10, 10.0, 100.0)
    assert wait == pytest.approx(1.0)
    _, wait = gcra(tat, 10, 10.0, 101.0)
    assert wait == 0
    # Idle long enough and the whole burst is back.
    tat2, _ = gcra(tat, 10, 10.0, 200.0)
    assert tat2 == pytest.approx(201.0)


def take_one(store, key: str, now: float) -> float:
    """One token from a bucket of 2 per 10 s: 0 when allowed, else the seconds to wait."""
    [(_taken, wait)] = store.take_many([Want(key, 2, 10, 1)], now)
    return wait


def test_memory_buckets_are_keyed_independently():
    store = MemoryBuckets()
    assert [take_one(store, "a", 0.0) for _ in range(3)] == [0, 0, pytest.approx(5.0)]
    assert take_one(store, "b", 0.0) == 0


def test_redis_buckets_are_shared_between_processes():
    """Two stores with their own connections (as two web processes have) spend one bucket."""
    url = local_redis_url()
    key = f"test-limits:{uuid.uuid4().hex}"
    one, two = RedisBuckets(url), RedisBuckets(url)
    assert take_one(one, key, 1000.0) == 0
    assert take_one(two, key, 1000.0) == 0
    assert take_one(one, key, 1000.0) == pytest.approx(5.0)
    assert take_one(two, key, 1005.0) == 0


def run_reply_loop(api, alice, bob, *, turn_seconds: float, virtual_seconds: float):
    """Two sessions answer every message from the other as soon as they see it, retrying a
    refused send on their next turn. Returns what the hub let through and when it stopped them."""
    start = timezone.now()
    clock = 0.0
    through = {"alice": 0, "bob": 0}
    rate_limited = 0
    stopped_at = None
    pending = {"alice": 1, "bob": 1}  # each opens with one message
    sent_n = 0
    with time_machine.travel(start, tick=False) as traveller:
        while clock < virtual_seconds:
            for me, peer in ((alice, bob), (bob, alice)):
                got = api.get("inbox", me.token).json_body["messages"]
                texts = [m for m in got if m["kind"] == "text"]
                if got:
                    api.post("inbox/ack", me.token, {"ids": [m["id"] for m in got]})
                pending[me.name] += len(texts)
                if pending[me.name]:
                    sent_n += 1
                    r = api.post(
                        "messages", me.token, {"to": peer.ref, "message": f"{me.name} reply {sent_n}"}
                    )
                    if r.status_code == 429:
                        rate_limited += 1
                        continue
                    assert r.status_code == 201, r.json_body
                    pending[me.name] -= 1
                    if r.json_body["status"] == "queued":
                        through[me.name] += 1
                    elif stopped_at is None:
                        stopped_at = clock
            clock += turn_seconds
            traveller.move_to(start + timedelta(seconds=clock))
    return {"through": through, "rate_limited": rate_limited, "stopped_at": stopped_at}


@pytest.mark.parametrize(
    ("label", "turn_seconds", "run_for"),
    [("scripted, as fast as possible", 0.05, 20), ("model-paced", 5.0, 600), ("slow model", 30.0, 3000)],
)
def test_two_agents_in_a_reply_loop_are_slowed_then_stopped(
    api, register, settings, label, turn_seconds, run_for
):
    """The measured figure for the closing note: how many messages got through before the hub
    stopped a two-agent reply loop, with the default limits."""
    settings.SWITCHBOARD_RATE_PAIR, settings.SWITCHBOARD_RATE_PAIR_SECONDS = 10, 10
    settings.SWITCHBOARD_LOOP_EXCHANGES, settings.SWITCHBOARD_LOOP_WINDOW_SECONDS = 20, 1800
    alice, bob = register("alice"), register("bob")
    result = run_reply_loop(api, alice, bob, turn_seconds=turn_seconds, virtual_seconds=run_for)
    total = sum(result["through"].values())
    print(
        f"\nreply loop ({label}, {turn_seconds} s per turn): {total} messages got through "
        f"(alice {result['through']['alice']}, bob {result['through']['bob']}), "
        f"{result['rate_limited']} sends refused with 429, stopped after {result['stopped_at']:.1f} s of loop time"
    )
    assert result["stopped_at"] is not None
    # Stopped for good: nothing reached either inbox after the stop, though both kept answering.
    assert total <= 2 * settings.SWITCHBOARD_LOOP_EXCHANGES
    queued_after = Delivery.objects.filter(
        message__sender__isnull=False, state__in=["queued", "delivered", "read"]
    ).count()
    assert queued_after == total


def test_team_frames_do_not_count_toward_a_reply_loop(api, register, send, settings):
    """Frames are typed team traffic (assignments, idle notices), checked by the team API: only
    plain-text replies make a loop."""
    from messaging.models import AgentSession, MessageKind
    from messaging.services.pipeline import message_send
    from messaging.services.request import SendRequest

    settings.SWITCHBOARD_LOOP_EXCHANGES = 3
    alice, bob = register("alice"), register("bob")
    bob_session = AgentSession.objects.get(pk=bob.id)
    for i in range(3):
        assert send(alice, "bob", f"report {i}").json_body["status"] == "queued"
        frame = message_send(
            SendRequest(
                sender=bob_session, to=alice.id, text=f'{{"type": "note", "n": {i}}}', kind=MessageKind.FRAME
            )
        )
        assert frame.status == "queued"
    assert send(alice, "bob", "report 3").json_body["status"] == "queued"
    for i in range(3):
        send(bob, "alice", f"reply {i}")
    assert send(alice, "bob", "report 4").json_body["status"] == "held"


def test_a_send_asks_the_bucket_store_once(monkeypatch, db):
    """Both buckets (the hub's and the pair's) are charged in one call: one Redis round trip."""
    from messaging.services import limits
    from messaging.services.pipeline import message_send
    from messaging.services.request import SendRequest
    from messaging.services.sessions import session_register

    calls: list[str] = []
    store = MemoryBuckets()

    class Counting:
        def take_many(self, *args, **kwargs):
            calls.append("take_many")
            return store.take_many(*args, **kwargs)

        def give_back(self, *args, **kwargs):
            calls.append("give_back")
            return store.give_back(*args, **kwargs)

    monkeypatch.setattr(limits, "bucket_store", lambda: Counting())
    alice = session_register(name="alice").session
    session_register(name="bob")

    message_send(SendRequest(sender=alice, to="bob", text="hello"))

    assert calls == ["take_many"]


def test_memory_buckets_forget_refilled_buckets_once_there_are_many():
    """The embedded hub keeps a bucket per pair in memory; ones that have refilled are dropped
    when there are more than 100,000, so a long-running hub does not grow without bound."""
    store = MemoryBuckets()
    store.take_many([Want(f"old-{i}", 2, 10, 1) for i in range(100_001)], 0.0)
    take_one(store, "new", 100.0)  # every old bucket refilled long ago
    assert len(store._tats) == 1
