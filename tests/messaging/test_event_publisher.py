"""The process's live-event publisher on Redis pub/sub: what it publishes arrives through the
channel layer's own subscription, in commit order; a bad round is logged and the next goes out;
a backed-up queue drops with a warning instead of growing without bound."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid

import pytest
import redis
from channels.layers import InMemoryChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

from messaging.services import events
from tests.integration.harness import wait_until
from tests.local_redis import local_redis_url


def _event(kind: str, n: int) -> dict:
    return {"type": "hub.event", "kind": kind, "data": {"n": n, "text": "héllo ✓"}}


def test_published_events_arrive_through_the_layers_own_subscription_in_order() -> None:
    url = local_redis_url()
    prefix = f"test-{uuid.uuid4().hex[:8]}"  # no other test's subscribers see these
    layer = RedisPubSubChannelLayer(hosts=[{"address": url}], prefix=prefix)
    publisher = events._Publisher(events._PubSubTarget(address=url, prefix=prefix))

    async def scenario() -> list[dict]:
        channel = await layer.new_channel()
        await layer.group_add("session.a", channel)
        await layer.group_add("operators", channel)
        # One batch for one group, then one for two groups, then a bundle: as a send hands them over.
        publisher.put(layer, [(["session.a"], _event("inbox.queued", 1))])
        publisher.put(layer, [(["session.b", "operators"], _event("message.sent", 2))])
        publisher.put(
            layer, [(["session.a"], {"type": "hub.events", "events": [_event("x", 3), _event("y", 4)]})]
        )
        got = [await asyncio.wait_for(layer.receive(channel), timeout=5) for _ in range(3)]
        await layer.flush()
        return got

    got = asyncio.run(scenario())
    assert got[0] == _event("inbox.queued", 1)
    assert got[1] == _event("message.sent", 2)  # through "operators"; session.b has no subscriber here
    assert got[2]["type"] == "hub.events" and [e["kind"] for e in got[2]["events"]] == ["x", "y"]


def test_an_event_that_cannot_be_serialized_spoils_no_other() -> None:
    url = local_redis_url()
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    layer = RedisPubSubChannelLayer(hosts=[{"address": url}], prefix=prefix)
    publisher = events._Publisher(events._PubSubTarget(address=url, prefix=prefix))

    class Unserializable(RedisPubSubChannelLayer):
        def serialize(self, message: dict) -> bytes:
            raise TypeError("cannot serialize")

    async def scenario() -> dict:
        channel = await layer.new_channel()
        await layer.group_add("operators", channel)
        bad = Unserializable(hosts=[{"address": url}], prefix=prefix)
        with pytest.raises(TypeError):  # raised to the caller, which logs it (`_send_many`)
            publisher.put(bad, [(["operators"], _event("bad", 0))])
        publisher.put(layer, [(["operators"], _event("good", 1))])
        got = await asyncio.wait_for(layer.receive(channel), timeout=5)
        await layer.flush()
        return got

    assert asyncio.run(scenario()) == _event("good", 1)


def test_a_round_that_redis_refuses_is_logged_not_raised(caplog) -> None:
    url = local_redis_url()
    publisher = events._Publisher(events._PubSubTarget(address="redis://127.0.0.1:9/0", prefix="x"))
    with caplog.at_level(logging.WARNING, logger="messaging.services.events"):
        publisher.publish_round([[("x__group__operators", b"1")], [("x__group__operators", b"2")]])
    assert "could not push 2 events" in caplog.text
    caplog.clear()
    publisher.redis = redis.Redis.from_url(url)  # a server that answers: the next round goes out quietly
    publisher.publish_round([[("x__group__operators", b"3")]])
    assert caplog.text == ""


def test_a_backed_up_queue_drops_new_batches_with_a_warning(caplog, monkeypatch) -> None:
    url = local_redis_url()
    publisher = events._Publisher(events._PubSubTarget(address=url, prefix="unused"))
    monkeypatch.setattr(publisher, "MAX_QUEUED", 0)
    with caplog.at_level(logging.WARNING, logger="messaging.services.events"):
        publisher.put(object(), [(["operators"], _event("a", 1)), (["operators"], _event("b", 2))])
        publisher.put(object(), [(["operators"], _event("c", 3))])
    assert publisher.dropped == 3
    assert caplog.text.count("backing up") == 1  # one line, not one per batch


def test_only_a_single_server_pubsub_layer_goes_through_the_publisher(settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"CONFIG": {"hosts": [{"address": "redis://127.0.0.1:1/0"}]}}}
    one = RedisPubSubChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0"}])
    assert events._pubsub_target(one) == events._PubSubTarget(address="redis://127.0.0.1:1/0", prefix="asgi")
    assert events._pubsub_target(InMemoryChannelLayer()) is None
    settings.CHANNEL_LAYERS = {
        "default": {"CONFIG": {"hosts": [{"address": "redis://a:1/0"}, {"address": "redis://b:1/0"}]}}
    }
    assert events._pubsub_target(one) is None  # spread over servers: the layer's own group_send


def test_an_in_memory_layer_gets_events_from_a_request_thread_without_the_thread_waiting(monkeypatch) -> None:
    """Embedded mode: a request's thread hands its events to the server's loop and goes on, even
    while the loop is busy; the loop publishes them later, in the order they were handed over."""
    from asgiref.sync import sync_to_async

    layer = InMemoryChannelLayer()
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    thread_done = threading.Event()

    def request_thread() -> None:
        for n in range(20):
            events._send_many([(["session.x"], _event("message.sent", n))])
        thread_done.set()

    async def scenario() -> tuple[bool, list[int]]:
        channel = await layer.new_channel()
        await layer.group_add("session.x", channel)
        request = asyncio.ensure_future(sync_to_async(request_thread)())
        await asyncio.sleep(0)  # the thread starts
        # The loop is busy (blocked) until the thread is done: a thread that waited for the loop
        # to publish each event would never be, and this gives up after 5 s.
        went_on = thread_done.wait(timeout=5)
        await request
        received = [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(20)]
        return went_on, [m["data"]["n"] for m in received]

    went_on, order = asyncio.run(scenario())
    assert went_on
    assert order == list(range(20))


def test_code_with_no_server_loop_behind_it_publishes_before_going_on(monkeypatch) -> None:
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    channel = asyncio.run(layer.new_channel())
    asyncio.run(layer.group_add("operators", channel))
    # a command or a pool task; this thread once ran a `sync_to_async` call, whose loop is gone
    from asgiref.sync import SyncToAsync

    gone = asyncio.new_event_loop()
    gone.close()
    monkeypatch.setattr(SyncToAsync.threadlocal, "main_event_loop", gone, raising=False)
    monkeypatch.setattr(SyncToAsync.threadlocal, "main_event_loop_pid", os.getpid(), raising=False)
    events._send_many([(["operators"], _event("task.done", 1))])
    assert asyncio.run(asyncio.wait_for(layer.receive(channel), 5))["data"]["n"] == 1


class _FakeRedis:
    """A Redis client that records each round's PUBLISHes (with the thread that sent them), after
    `gate` opens, or raises `fails` instead."""

    def __init__(self, rounds: list, *, fails: Exception | None = None) -> None:
        self.rounds, self.fails = rounds, fails
        self.gate = threading.Event()
        self.gate.set()

    def pipeline(self, transaction: bool = False) -> _FakeRedis._Pipe:
        return _FakeRedis._Pipe(self)

    class _Pipe:
        def __init__(self, client: _FakeRedis) -> None:
            self.client, self.sent = client, []

        def publish(self, channel: str, payload: bytes) -> None:
            self.sent.append(payload)

        def execute(self) -> None:
            assert self.client.gate.wait(5)
            if self.client.fails:
                raise self.client.fails
            self.client.rounds.append((threading.current_thread().name, self.sent))


class _Bytes:
    """A layer whose serialize is the event's number, so rounds read as lists of numbers."""

    def serialize(self, event: dict) -> bytes:
        return str(event["n"]).encode()


def _publisher_with(inline: _FakeRedis, thread: _FakeRedis) -> events._Publisher:
    publisher = events._Publisher(events._PubSubTarget(address="redis://127.0.0.1:9/0", prefix="x"))
    publisher.inline_redis, publisher.redis = inline, thread
    return publisher


def test_a_batch_with_nothing_ahead_of_it_goes_out_on_the_callers_thread_before_put_returns() -> None:
    rounds: list = []
    publisher = _publisher_with(_FakeRedis(rounds), _FakeRedis(rounds))
    publisher.put(_Bytes(), [(["operators"], {"n": 1})])
    publisher.put(_Bytes(), [(["session.a", "operators"], {"n": 2})])
    assert rounds == [
        (threading.current_thread().name, [b"1"]),
        (threading.current_thread().name, [b"2", b"2"]),
    ]


def test_batches_handed_over_during_a_round_wait_for_the_thread_and_keep_their_order() -> None:
    rounds: list = []
    inline = _FakeRedis(rounds)
    publisher = _publisher_with(inline, _FakeRedis(rounds))
    inline.gate.clear()  # the first round hangs in Redis until let go
    first = threading.Thread(target=publisher.put, args=(_Bytes(), [(["operators"], {"n": 1})]))
    first.start()
    wait_until(lambda: publisher._unpublished == 1, timeout=5, what="the first batch started its round")
    for n in (2, 3, 4):  # from another thread, while the first round is still out
        publisher.put(_Bytes(), [(["operators"], {"n": n})])
    assert rounds == []  # none went ahead of the first
    inline.gate.set()
    first.join(5)
    wait_until(lambda: sum(len(sent) for _, sent in rounds) == 4, timeout=5, what="every batch was published")

    assert [sent for _, sent in rounds][0] == [b"1"]
    assert [payload for _, sent in rounds for payload in sent] == [b"1", b"2", b"3", b"4"]
    assert {name for name, _ in rounds[1:]} == {"switchboard-events"}
    wait_until(lambda: publisher._unpublished == 0, timeout=5, what="the thread counted its rounds")
    publisher.put(_Bytes(), [(["operators"], {"n": 5})])  # nothing ahead again: at once
    assert rounds[-1] == (threading.current_thread().name, [b"5"])


def test_a_batch_redis_did_not_take_at_once_goes_to_the_thread_until_a_round_of_its_own_goes_out(
    caplog,
) -> None:
    import redis as redis_lib

    rounds: list = []
    inline = _FakeRedis(rounds, fails=redis_lib.TimeoutError("Timeout reading from socket"))
    thread = _FakeRedis(rounds)
    thread.gate.clear()
    publisher = _publisher_with(inline, thread)
    with caplog.at_level(logging.WARNING, logger="messaging.services.events"):
        publisher.put(_Bytes(), [(["operators"], {"n": 1})])  # times out; goes to the thread
    assert "the events thread tries again" in caplog.text
    publisher.put(_Bytes(), [(["operators"], {"n": 2})])  # straight to the thread: no second wait
    inline.fails = None
    thread.gate.set()
    wait_until(lambda: publisher._unpublished == 0, timeout=5, what="the thread published both")

    assert [payload for _, sent in rounds for payload in sent] == [b"1", b"2"]
    assert {name for name, _ in rounds} == {"switchboard-events"}
    publisher.put(_Bytes(), [(["operators"], {"n": 3})])  # the thread's round went out: at once again
    assert rounds[-1][1] == [b"3"] and rounds[-1][0] != "switchboard-events"
