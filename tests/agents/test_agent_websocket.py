"""The agent WebSocket /ws/agent/: authentication, push on queue, flush on connect, acks."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from hub.routing import websocket_application
from messaging.models import Delivery
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sessions import Registration, session_register

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@database_sync_to_async
def register(name: str) -> Registration:
    return session_register(name=name)


@database_sync_to_async
def send(sender: Registration, to: str, text: str) -> str:
    return str(message_send(SendRequest(sender=sender.session, to=to, text=text)).message.id)


@database_sync_to_async
def delivery_state(message_id: str) -> str:
    return Delivery.objects.get(message_id=message_id).state


def connect(token: str | None = None) -> WebsocketCommunicator:
    headers = [(b"host", b"127.0.0.1:8765")]  # every WebSocket handshake names the hub's host
    headers += [(b"authorization", f"Bearer {token}".encode())] if token else []
    return WebsocketCommunicator(websocket_application, "/ws/agent/", headers=headers)


async def hello(ws: WebsocketCommunicator) -> dict[str, Any]:
    connected, _ = await ws.connect()
    assert connected
    greeting = await ws.receive_json_from(timeout=5)
    assert greeting["type"] == "hello"
    return greeting


async def test_header_token_connects_and_queued_messages_are_flushed_on_connect() -> None:
    alice, bob = await register("alice"), await register("bob")
    waiting = await send(alice, "bob", "sent while bob was offline")
    ws = connect(bob.token)

    greeting = await hello(ws)
    pushed = await ws.receive_json_from(timeout=5)

    assert greeting["session"]["ref"] == bob.session.ref
    assert pushed["type"] == "messages"
    assert [m["id"] for m in pushed["messages"]] == [waiting]
    assert pushed["messages"][0]["framed"].startswith('[SWITCHBOARD FROM="alice"')
    assert await delivery_state(waiting) == "delivered"
    await ws.disconnect()


async def test_messages_are_pushed_as_they_are_queued_and_acks_mark_them_read() -> None:
    alice, bob = await register("alice"), await register("bob")
    ws = connect(bob.token)
    await hello(ws)
    assert await ws.receive_nothing(timeout=0.2)

    message_id = await send(alice, "bob", "live push")
    pushed = await ws.receive_json_from(timeout=5)
    assert [m["text"] for m in pushed["messages"]] == ["live push"]

    await ws.send_json_to({"type": "ack", "ids": [message_id]})
    acked = await ws.receive_json_from(timeout=5)
    assert acked == {
        "type": "acked",
        "acked": [message_id],
        "already_read": [],
        "not_acked": [],
        "unknown": [],
    }
    assert await delivery_state(message_id) == "read"
    await ws.disconnect()


async def test_the_sender_gets_receipts_and_the_recipient_no_echo_of_its_own_moves() -> None:
    alice, bob = await register("alice"), await register("bob")
    alice_ws, bob_ws = connect(alice.token), connect(bob.token)
    await hello(alice_ws)
    await hello(bob_ws)

    message_id = await send(alice, "bob", "with receipts")
    assert (await bob_ws.receive_json_from(timeout=5))["type"] == "messages"
    await bob_ws.send_json_to({"type": "ack", "ids": [message_id]})
    assert (await bob_ws.receive_json_from(timeout=5))["type"] == "acked"

    receipts = []
    while len(receipts) < 3:  # the sender's own notice, then delivered, then read
        frame = await alice_ws.receive_json_from(timeout=5)
        assert frame["type"] == "event", frame
        receipts.append((frame["kind"], frame["data"].get("state")))
    assert receipts == [
        ("message.sent", "queued"),
        ("delivery.changed", "delivered"),
        ("delivery.changed", "read"),
    ]
    assert await bob_ws.receive_nothing(timeout=0.3)  # no event about its own pull and ack
    await alice_ws.disconnect()
    await bob_ws.disconnect()


async def test_token_in_the_first_frame_works_too() -> None:
    bob = await register("bob")
    ws = connect()
    connected, _ = await ws.connect()
    assert connected

    await ws.send_json_to({"type": "auth", "token": bob.token})
    greeting = await ws.receive_json_from(timeout=5)

    assert greeting["type"] == "hello" and greeting["session"]["name"] == "bob"
    await ws.send_json_to({"type": "ping"})
    assert await ws.receive_json_from(timeout=5) == {"type": "pong"}
    await ws.disconnect()


async def test_a_bad_header_token_is_refused_at_the_handshake() -> None:
    await register("bob")
    connected, _ = await connect("sbs_not-a-real-token").connect()
    assert not connected


async def test_a_bad_first_frame_token_closes_the_socket_and_joins_nothing() -> None:
    alice, _ = await register("alice"), await register("bob")
    ws = connect()
    await ws.connect()

    await ws.send_json_to({"type": "ack", "ids": []})  # anything before auth counts as a failed auth
    refused = await ws.receive_json_from(timeout=5)
    closed = await ws.receive_output(timeout=5)

    assert refused["error"] == "unauthorized"
    assert closed == {"type": "websocket.close", "code": 4401}
    message_id = await send(alice, "bob", "not for a stranger")
    assert await delivery_state(message_id) == "queued"


async def test_a_bad_ack_frame_gets_an_error_and_the_socket_stays_open() -> None:
    bob = await register("bob")
    ws = connect(bob.token)
    await hello(ws)

    await ws.send_json_to({"type": "ack", "ids": "not-a-list"})
    error = await ws.receive_json_from(timeout=5)
    await ws.send_json_to({"type": "ping"})

    assert error["type"] == "error" and error["error"] == "invalid"
    assert await ws.receive_json_from(timeout=5) == {"type": "pong"}
    await ws.disconnect()


@database_sync_to_async
def last_seen(session_id: object) -> object:
    from messaging.models import AgentSession

    return AgentSession.objects.get(pk=session_id).last_seen


async def test_a_ping_counts_as_a_heartbeat() -> None:
    bob = await register("bob")
    ws = connect(bob.token)
    await hello(ws)
    before = await last_seen(bob.session.id)

    await asyncio.sleep(0.05)
    await ws.send_json_to({"type": "ping"})
    assert await ws.receive_json_from(timeout=5) == {"type": "pong"}

    assert await last_seen(bob.session.id) > before
    await ws.disconnect()


async def next_frame(ws: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    """The next frame of type `kind`, skipping live events (read receipts)."""
    while True:
        frame = await ws.receive_json_from(timeout=5)
        if frame["type"] == kind:
            return frame
        assert frame["type"] == "event", frame


async def test_an_ack_pulls_again_only_when_the_push_window_was_full(monkeypatch) -> None:
    from messaging import consumers

    pulls: list[int] = []
    real_pull = consumers._pull

    async def counted_pull(session, limit=consumers.PUSH_BATCH):
        pulls.append(limit)
        return await real_pull(session, limit)

    monkeypatch.setattr(consumers, "_pull", counted_pull)
    monkeypatch.setattr(consumers, "PUSH_WINDOW", 2)
    alice, bob = await register("alice"), await register("bob")
    ws = connect(bob.token)
    await hello(ws)  # pull 1: nothing waiting
    first = await send(alice, "bob", "one")
    assert [m["id"] for m in (await next_frame(ws, "messages"))["messages"]] == [first]  # pull 2

    # Given a window with room left, an ack is answered without asking the database for more
    await ws.send_json_to({"type": "ack", "ids": [first]})
    assert await next_frame(ws, "acked")
    assert len(pulls) == 2

    # When the window fills (two unacked) and a fourth message waits behind it
    second, third = await send(alice, "bob", "two"), await send(alice, "bob", "three")
    got = (await next_frame(ws, "messages"))["messages"]
    while len(got) < 2:
        got += (await next_frame(ws, "messages"))["messages"]
    assert [m["id"] for m in got] == [second, third]
    fourth = await send(alice, "bob", "four")  # held back by the window
    await ws.send_json_to({"type": "ack", "ids": [second, third]})

    # Then the ack that opens the window comes first, and pushes what waited
    frames = []
    while not frames or frames[-1]["type"] != "messages":
        frames.append(await ws.receive_json_from(timeout=5))
    kinds = [f["type"] for f in frames if f["type"] != "event"]
    assert kinds == ["acked", "messages"]
    assert [m["id"] for m in frames[-1]["messages"]] == [fourth]
    await ws.disconnect()


async def test_socket_database_calls_share_the_one_thread_on_sqlite_and_spread_out_on_postgresql() -> None:
    # An in-memory SQLite database shared between threads refuses a write while another thread
    # reads ("database table is locked"), and a file database takes one writer at a time anyway.
    from django.db import connection

    from messaging.consumers import _off_the_shared_thread

    socket_thread = await _off_the_shared_thread(threading.get_ident)()
    shared_thread = await database_sync_to_async(threading.get_ident)()

    assert (socket_thread == shared_thread) == (connection.vendor == "sqlite")


async def test_frames_and_pushes_are_handled_without_a_hop_to_the_shared_thread(monkeypatch) -> None:
    # Channels closes stale database connections on the shared sync thread before every message
    # a consumer handles; the agent socket's database calls do that on their own thread, so a
    # push, an ack or a ping must not queue behind whatever the shared thread is doing.
    import channels.consumer

    hops: list[str] = []
    real_hop = channels.consumer.aclose_old_connections

    async def counted_hop() -> None:
        hops.append("hop")
        await real_hop()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted_hop)
    alice, bob = await register("alice"), await register("bob")
    ws = connect(bob.token)
    await hello(ws)

    message_id = await send(alice, "bob", "pushed without a hop")
    assert [m["id"] for m in (await next_frame(ws, "messages"))["messages"]] == [message_id]
    await ws.send_json_to({"type": "ack", "ids": [message_id]})
    assert (await next_frame(ws, "acked"))["acked"] == [message_id]
    await ws.send_json_to({"type": "ping"})
    assert await next_frame(ws, "pong") == {"type": "pong"}
    await ws.disconnect()

    assert hops == []
    assert await delivery_state(message_id) == "read"


async def test_one_token_holds_a_bounded_number_of_sockets_at_once(settings: Any) -> None:
    """The attack: eve opens agent sockets with her one token without end; each is a channel on
    the layer and a pull at every wake-up of her inbox, held by the web process for as long as
    she keeps it. Past SWITCHBOARD_SOCKETS_PER_SESSION of hers in one process, the next is
    refused (an error frame, then close 4429); bob's sockets are not, and hers are again once
    one of hers closed."""
    settings.SWITCHBOARD_SOCKETS_PER_SESSION = 2
    eve, bob = await register("eve"), await register("bob")
    first, second = connect(eve.token), connect(eve.token)
    await hello(first)
    await hello(second)

    third = connect(eve.token)
    connected, _ = await third.connect()
    assert connected
    refused = await third.receive_json_from(timeout=5)
    closed = await third.receive_output(timeout=5)

    assert (refused["type"], refused["error"], refused["reason"]) == (
        "error",
        "rate_limited",
        "too_many_sockets",
    )
    assert closed == {"type": "websocket.close", "code": 4429}
    others = connect(bob.token)
    await hello(others)
    await first.disconnect()
    again = connect(eve.token)
    await hello(again)
    for ws in (second, others, again):
        await ws.disconnect()
