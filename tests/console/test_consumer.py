"""The operator WebSocket: login, staff and origin are required; it hears the `operators` group only."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from hub.routing import websocket_application
from messaging.services import events as events_service
from messaging.services.events import OPERATORS_GROUP, session_group

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = (b"origin", b"http://127.0.0.1:8765")
HOST = (b"host", b"127.0.0.1:8765")  # a browser names the hub it opened the socket on


def _cookie_for(username: str, *, staff: bool) -> bytes:
    """Log a user in through Django and return the Cookie header its browser would send."""
    user = get_user_model().objects.create_user(username, password="pw-123456789", is_staff=staff)
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def _connect(*headers: tuple[bytes, bytes]) -> tuple[WebsocketCommunicator, Any]:
    communicator = WebsocketCommunicator(websocket_application, "/ws/console/", headers=[HOST, *headers])
    connected = await communicator.connect(timeout=5)
    return communicator, connected


async def test_a_staff_login_with_our_origin_connects_and_hears_operator_events() -> None:
    cookie = await sync_to_async(_cookie_for)("op", staff=True)
    communicator, (accepted, _) = await _connect(ORIGIN, (b"cookie", cookie))
    assert accepted
    assert (await communicator.receive_json_from(timeout=5))["kind"] == "hello"

    await get_channel_layer().group_send(
        OPERATORS_GROUP, {"type": "hub.event", "kind": "message.sent", "data": {"delivery_id": 7}}
    )
    assert await communicator.receive_json_from(timeout=5) == {
        "kind": "message.sent",
        "data": {"delivery_id": 7},
    }
    await communicator.disconnect()


async def test_without_a_login_the_socket_is_refused() -> None:
    communicator, (accepted, code) = await _connect(ORIGIN)
    assert not accepted
    assert code == 4403


async def test_a_logged_in_user_who_is_not_staff_is_refused() -> None:
    cookie = await sync_to_async(_cookie_for)("visitor", staff=False)
    communicator, (accepted, code) = await _connect(ORIGIN, (b"cookie", cookie))
    assert not accepted
    assert code == 4403


@pytest.mark.parametrize("origin", [b"http://evil.example", b"null"])
async def test_a_foreign_or_missing_origin_is_refused_even_with_a_staff_login(origin: bytes) -> None:
    cookie = await sync_to_async(_cookie_for)("op2", staff=True)
    communicator, (accepted, _) = await _connect((b"origin", origin), (b"cookie", cookie))
    assert not accepted
    no_origin, (accepted_without, _) = await _connect((b"cookie", cookie))
    assert not accepted_without


async def test_events_for_one_session_do_not_reach_the_operator_socket() -> None:
    cookie = await sync_to_async(_cookie_for)("op3", staff=True)
    communicator, (accepted, _) = await _connect(ORIGIN, (b"cookie", cookie))
    assert accepted
    await communicator.receive_json_from(timeout=5)  # hello
    layer = get_channel_layer()
    await layer.group_send(
        session_group("abc"), {"type": "hub.event", "kind": "inbox.queued", "data": {"only": "session"}}
    )
    await layer.group_send("team.1", {"type": "hub.event", "kind": "task.changed", "data": {"only": "team"}})
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_a_registration_committed_by_the_service_reaches_the_operator_socket() -> None:
    """Given an operator socket, when a session registers, then `session.changed` arrives for it."""
    from messaging.services.sessions import session_register

    cookie = await sync_to_async(_cookie_for)("op4", staff=True)
    communicator, (accepted, _) = await _connect(ORIGIN, (b"cookie", cookie))
    assert accepted
    await communicator.receive_json_from(timeout=5)  # hello
    registration = await sync_to_async(session_register)(name="alice")
    event = await communicator.receive_json_from(timeout=5)
    assert event["kind"] == "session.changed"
    assert event["data"]["id"] == str(registration.session.id)
    await communicator.disconnect()


async def test_a_batch_send_reaches_the_operator_socket_as_one_event_per_message_in_one_group_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given an operator socket, when a batch of three is sent, then the operators group gets one
    channel message (not three) and the socket still shows each `message.sent`, in order."""
    from messaging.models import AgentSession
    from messaging.services.pipeline import messages_send_batch
    from messaging.services.sessions import session_register

    cookie = await sync_to_async(_cookie_for)("op5", staff=True)
    communicator, (accepted, _) = await _connect(ORIGIN, (b"cookie", cookie))
    assert accepted
    await communicator.receive_json_from(timeout=5)  # hello
    alice = (await sync_to_async(session_register)(name="alice")).session
    bob = (await sync_to_async(session_register)(name="bob")).session
    for _ in range(2):
        assert (await communicator.receive_json_from(timeout=5))["kind"] == "session.changed"
    # Counted where every layer's events are handed over (the in-memory layer's group_send, or
    # the Redis publisher, which bypasses group_send), so it holds on SQLite and on PG + Redis.
    sent_to: list[str] = []
    hand_over = events_service._send_many

    def counting(batch: list[tuple[list[str], dict[str, Any]]]) -> None:
        sent_to.extend(group for groups, _event in batch for group in groups)
        hand_over(batch)

    monkeypatch.setattr(events_service, "_send_many", counting)
    items = [{"to": bob.ref, "text": f"batch {i}"} for i in range(3)]
    await sync_to_async(messages_send_batch)(sender=await AgentSession.objects.aget(pk=alice.id), items=items)

    events = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
    assert [(e["kind"], e["data"]["preview"]) for e in events] == [
        ("message.sent", f"batch {i}") for i in range(3)
    ]
    assert sent_to.count(OPERATORS_GROUP) == 1
    await communicator.disconnect()


async def test_events_reach_the_console_without_a_hop_to_the_shared_thread(monkeypatch) -> None:
    # The console socket never touches the database; each event it forwards must not wait for
    # the shared sync thread (channels hops there before every message by default).
    import channels.consumer

    hops: list[str] = []

    async def counted_hop() -> None:
        hops.append("hop")

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted_hop)
    await test_a_staff_login_with_our_origin_connects_and_hears_operator_events()

    assert hops == []
