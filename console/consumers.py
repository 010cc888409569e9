"""The operator's WebSocket: a logged-in staff browser joins the `operators` group and receives
every `hub.event` the services publish there. It only listens; decisions go through CSRF-checked
POSTs, so nothing arriving on a socket can approve anything.

A socket hears the hub only while the browser session that opened it could still load a console
page: it closes (4403) when that session logs out, and when a re-check finds the session expired or
its user no longer an active staff member with the same password. Re-checks run every
`recheck_seconds` and at once when the user is saved or deleted (`console.signals`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib import auth

from messaging.consumers import LoopConsumer
from messaging.services.events import OPERATORS_GROUP

log = logging.getLogger(__name__)

# Close codes in the 4000 range are ours: the browser shows them and stops retrying on 4403.
CLOSE_FORBIDDEN = 4403
CLOSE_CHECK_FAILED = 1011  # the browser retries, and the retry is checked afresh
# Events on an operator's own group (`operator_group`), handled by the socket, never shown.
SIGNED_OUT_EVENT = "console.signed_out"  # data: {"session": session_digest(key)}
RECHECK_EVENT = "console.recheck"


def operator_group(user_id: Any) -> str:
    """The group of every console socket one user opened."""
    return f"operator.{user_id}"


def session_digest(session_key: str | None) -> str:
    """How an event names a browser session: the key itself is a credential and stays out of the
    channel layer."""
    return hashlib.sha256((session_key or "").encode()).hexdigest()[:32]


def recheck_seconds() -> float:
    """How often an open console socket re-checks its browser session: at most a minute, and
    never longer than the session lives without a request."""
    return float(min(60, settings.SESSION_COOKIE_AGE))


def is_operator_user(user: Any) -> bool:
    """Staff users are operators; anyone else (anonymous, inactive, non-staff) is not."""
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


@database_sync_to_async
def still_signed_in(session_key: str | None, user_id: Any) -> bool:
    """True while the browser session `session_key` is signed in as the operator `user_id`, as
    Django would judge it on the next page load (not logged out or expired, the password unchanged
    since, the user still active staff). Reading the session does not extend it."""
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    return is_operator_user(user) and str(user.pk) == str(user_id)


class OperatorConsumer(LoopConsumer):
    """`/ws/console/`: live events for the console. Login and staff status are checked before the
    socket joins any group; the origin is checked by the router in front of it."""

    groups: list[str] = []  # joined explicitly after the access check, never by default
    socket_kind = "console"

    async def connect(self) -> None:
        self.joined: list[str] = []
        self.rechecks: asyncio.Task[None] | None = None
        user = self.scope.get("user")
        if not is_operator_user(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        assert user is not None
        session = self.scope.get("session")
        self.session_key: str | None = session.session_key if session is not None else None
        self.user_id = user.pk
        for group in (operator_group(user.pk), OPERATORS_GROUP):
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
        # Joined first, checked after: a logout or demotion just before the join is seen here.
        if not await still_signed_in(self.session_key, self.user_id):
            await self._closed(CLOSE_FORBIDDEN)
            return
        await self.accept()
        await self.send_json({"kind": "hello", "data": {"group": OPERATORS_GROUP}})
        self.rechecks = asyncio.ensure_future(self._recheck_every(recheck_seconds()))

    async def disconnect(self, code: int) -> None:
        if self.rechecks is not None:
            self.rechecks.cancel()
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = []

    async def _recheck_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self._recheck()
            except Exception:  # a session that cannot be checked is not trusted: the page reconnects
                log.warning("could not re-check a console session; closing its socket", exc_info=True)
                await self._closed(CLOSE_CHECK_FAILED)
                return

    async def _recheck(self) -> None:
        if not await still_signed_in(self.session_key, self.user_id):
            await self._closed(CLOSE_FORBIDDEN)

    async def _closed(self, code: int) -> None:
        for group in self.joined:  # nothing more reaches it while the close is under way
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = []
        await self.close(code=code)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The browser may ping to keep proxies from closing an idle socket; nothing else is accepted.
        if isinstance(content, dict) and content.get("kind") == "ping":
            await self.send_json({"kind": "pong", "data": {}})

    async def hub_event(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == SIGNED_OUT_EVENT:
            if event["data"].get("session") == session_digest(self.session_key):
                await self._closed(CLOSE_FORBIDDEN)
            return
        if kind == RECHECK_EVENT:
            await self._recheck()
            return
        if not self.joined:
            return  # signed out: an event already on its way is dropped
        await self.send_json({"kind": kind, "data": event["data"]})

    async def hub_events(self, message: dict[str, Any]) -> None:
        """Many events for this group at once (`announce_many`): each goes out as if alone."""
        for event in message["events"]:
            await self.hub_event(event)
