"""An open console socket hears the hub only while the browser session that opened it is signed
in as an operator: a logout, a demotion, a deletion or an expired session closes it, and events
published after that never reach it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

import console.consumers
from hub.routing import websocket_application
from messaging.services.events import OPERATORS_GROUP
from tests.sockets import closed_within

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
HEADERS = [(b"origin", b"http://127.0.0.1:8765"), (b"host", b"127.0.0.1:8765")]
SECRET_EVENT = {"type": "hub.event", "kind": "message.sent", "data": {"preview": "deploy key ..."}}


def _operator(username: str) -> Any:
    return get_user_model().objects.create_user(username, password="pw-123456789", is_staff=True)


def _browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _cookie(client: Client) -> bytes:
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def _open(client: Client) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(
        websocket_application, "/ws/console/", headers=[*HEADERS, (b"cookie", _cookie(client))]
    )
    accepted, _ = await socket.connect(timeout=5)
    assert accepted
    assert (await socket.receive_json_from(timeout=5))["kind"] == "hello"
    return socket


async def _still_hears(socket: WebsocketCommunicator) -> None:
    await get_channel_layer().group_send(OPERATORS_GROUP, SECRET_EVENT)
    assert (await socket.receive_json_from(timeout=5))["kind"] == "message.sent"


async def test_logging_out_closes_the_sockets_of_that_browser_session_only() -> None:
    """Given an operator with the console open in two browsers, when one browser logs out, then
    that browser's socket closes (4403) and hears nothing more, and the other stays live."""
    user = await sync_to_async(_operator)("op")
    laptop, desktop = await sync_to_async(_browser)(user), await sync_to_async(_browser)(user)
    on_laptop, on_desktop = await _open(laptop), await _open(desktop)

    answer = await sync_to_async(laptop.post)("/logout/")
    assert answer.status_code == 302

    frames, code = await closed_within(on_laptop, 5)
    assert (frames, code) == ([], 4403)
    await _still_hears(on_desktop)
    await on_desktop.disconnect()


@pytest.mark.parametrize("change", ["no_longer_staff", "deactivated", "deleted", "password_reset"])
async def test_a_change_to_the_operator_closes_its_open_sockets(change: str) -> None:
    """Given an operator's open console socket, when an administrator takes away its staff status,
    deactivates or deletes the user, or sets a new password, then the socket closes (4403) at once,
    without waiting for the next periodic re-check."""
    user = await sync_to_async(_operator)(f"op-{change}")
    socket = await _open(await sync_to_async(_browser)(user))

    def change_user() -> None:
        if change == "no_longer_staff":
            user.is_staff = False
            user.save()
        elif change == "deactivated":
            user.is_active = False
            user.save()
        elif change == "deleted":
            user.delete()
        else:
            user.set_password("another-pw-987654321")
            user.save()

    await sync_to_async(change_user)()
    frames, code = await closed_within(socket, 5)
    assert (frames, code) == ([], 4403)


async def test_a_socket_closes_when_its_session_expires_and_rechecks_do_not_extend_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given an open console socket, its re-checks do not keep the session alive; once the session
    has expired (no page loaded for SWITCHBOARD_SESSION_IDLE_SECONDS), the next re-check closes
    the socket."""
    monkeypatch.setattr(console.consumers, "recheck_seconds", lambda: 0.1)
    user = await sync_to_async(_operator)("op-idle")
    browser = await sync_to_async(_browser)(user)
    socket = await _open(browser)
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value
    expiry = (await Session.objects.aget(session_key=key)).expire_date

    assert await socket.receive_nothing(timeout=0.5)  # about five re-checks: still signed in
    assert (await Session.objects.aget(session_key=key)).expire_date == expiry
    await _still_hears(socket)

    await Session.objects.filter(session_key=key).aupdate(expire_date=timezone.now() - timedelta(seconds=1))
    frames, code = await closed_within(socket, 5)
    assert (frames, code) == ([], 4403)
