"""The agent WebSocket `/ws/agent/`: pushes a session's messages as they are queued, takes acks.

Authentication: the session token in an `Authorization: Bearer ...` header of the handshake, or
in the first frame `{"type": "auth", "token": "..."}` within AUTH_SECONDS. Never in the URL (URLs
end up in logs). The socket joins the group `session.<id>` only after the token checks out, and
learns of queued messages as `messaging.services.waiting` says (the wake-ups on that group).

Server → agent frames:
  {"type": "hello", "session": {...}}                 after authentication
  {"type": "messages", "messages": [frame, ...]}      queued messages (now marked delivered)
  {"type": "acked", ...}                              the answer to an ack
  {"type": "event", "kind": ..., "data": ...}         other live events (e.g. read receipts)
  {"type": "error", "error": code, "detail": sentence}
  {"type": "error", "error": "session_closed", ...}   then close 4403: the session exited (its
                                                      token is revoked) or an operator stopped it
  {"type": "error", "error": "rate_limited", "reason": "too_many_sockets", ...}   then close 4429:
                                                      the session holds SWITCHBOARD_SOCKETS_PER_SESSION
                                                      sockets in this process already
Agent → server: {"type": "auth", "token"}, {"type": "ack", "ids": [message id, ...]}, {"type": "ping"}
(a ping also counts as a heartbeat, like any authenticated HTTP call).

A socket lives only as long as its session is open and its token holds: `session_set_status`
announces `session.closed` to the session's group when the session exits or is user-stopped, and
`session_reissue` when a retried registration replaces the token; every socket of that session,
in whichever web process, closes on it. A socket that joins its group just then reads the status
and the token back after joining, so it cannot miss the close.

The database stays the truth: a push only happens after the pull has moved the delivery to
delivered, and a client that drops mid-push can fetch those again with `include_unacked`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from channels.consumer import get_handler_name
from channels.db import DatabaseSyncToAsync
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import connections

from messaging.errors import SwitchboardError
from messaging.framing import frames_for_recipient
from messaging.metrics import OPEN_WEBSOCKETS
from messaging.models import AgentSession
from messaging.principals import session_principal
from messaging.services.delivery import inbox_ack, inbox_pull
from messaging.services.sessions import (
    SESSION_CLOSED_EVENT,
    closed_problem,
    session_from_token,
    session_socket_problem,
    session_summary,
    session_touch,
)
from messaging.services.waiting import InboxSubscription, wakes_inbox

T = TypeVar("T")
AUTH_SECONDS = 10.0
CLOSE_UNAUTHORIZED = 4401
CLOSE_SESSION_CLOSED = 4403
CLOSE_TOO_MANY_SOCKETS = 4429
PUSH_BATCH = 100
MAX_BATCHES_PER_FLUSH = 100
# Flow control: at most this many pushed-but-unacked messages per socket. A client that stops
# reading (or acking) holds at most this much of the server's memory; the rest stays queued in the
# database until it acks, reconnects or pulls.
PUSH_WINDOW = 100


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _off_the_shared_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """`database_sync_to_async` on the server's thread pool instead of the one thread every
    consumer of the process shares by default: one socket's pull or ack does not wait behind
    every other socket's. Each socket still awaits its own calls one at a time, in order.
    On SQLite, which takes one writer at a time, the shared thread stays: more threads would
    only wait for each other (and the test suite's in-memory database refuses them)."""
    sqlite = connections["default"].vendor == "sqlite"  # the engine is hub.sqlite, Django's beneath
    return DatabaseSyncToAsync(fn, thread_sensitive=sqlite)


@_off_the_shared_thread
def _authenticate(token: str) -> AgentSession | None:
    session = session_from_token(token)
    if session is not None:
        session_touch(session)
    return session


@_off_the_shared_thread
def _socket_problem(session: AgentSession) -> str | None:
    return session_socket_problem(session.id, token_hash=session.token_hash)


@_off_the_shared_thread
def _touch(session: AgentSession) -> None:
    session_touch(session)


@_off_the_shared_thread
def _pull(session: AgentSession, limit: int = PUSH_BATCH) -> list[dict[str, Any]]:
    deliveries = inbox_pull(recipient=session, actor=session_principal(session), limit=limit)
    return frames_for_recipient(deliveries)


@_off_the_shared_thread
def _ack(session: AgentSession, ids: list[str]) -> dict[str, list[str]]:
    return inbox_ack(recipient=session, actor=session_principal(session), message_ids=ids)


class SocketPlaces:
    """How many agent sockets each session holds open in this web process, bounded by
    SWITCHBOARD_SOCKETS_PER_SESSION. A socket's costs (a channel on the layer, a pull at every
    wake-up of its inbox, its buffers) are this process's, so the count is too: it lives and dies
    with the sockets it counts, and one process's bound needs nothing from another. Touched only
    on the process's event loop."""

    def __init__(self) -> None:
        self.held: dict[object, int] = {}

    def take(self, session_id: object) -> bool:
        """Take a place for one more socket of the session; False when it holds its bound."""
        if self.held.get(session_id, 0) >= settings.SWITCHBOARD_SOCKETS_PER_SESSION:
            return False
        self.held[session_id] = self.held.get(session_id, 0) + 1
        return True

    def give_back(self, session_id: object) -> None:
        left = self.held.get(session_id, 0) - 1
        if left > 0:
            self.held[session_id] = left
        else:
            self.held.pop(session_id, None)


SOCKET_PLACES = SocketPlaces()


class LoopConsumer(AsyncJsonWebsocketConsumer):
    """A JSON WebSocket consumer whose handlers never use the database on the event loop.

    Channels' consumers hop to the process's one shared sync thread before every message they
    handle (each frame from the client, each event from the channel layer), to close stale
    database connections there. A subclass reaches the database only through
    `DatabaseSyncToAsync` calls (such as `_off_the_shared_thread`), which close stale connections
    on their own thread before and after, or not at all; so the hop is skipped, and no push waits
    for a round trip to that thread behind whatever else waits for it (on SQLite, every socket's
    database calls run there)."""

    socket_kind = "other"  # its label in the open-WebSockets gauge (messaging.metrics)

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        if not getattr(self, "counted_open", False):
            self.counted_open = True
            OPEN_WEBSOCKETS.labels(self.socket_kind).inc()

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Counted down once, whichever way the socket ends, for each one counted up.
        if getattr(self, "counted_open", False):
            self.counted_open = False
            OPEN_WEBSOCKETS.labels(self.socket_kind).dec()
        await super().websocket_disconnect(message)

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)


class AgentConsumer(LoopConsumer):
    """One agent session's live connection."""

    socket_kind = "agent"
    groups: list[str] = []  # joined only after authentication

    async def connect(self) -> None:
        self.session: AgentSession | None = None
        self.placed: object | None = None  # the session whose socket place this holds
        self.closed = False
        self.subscription: InboxSubscription | None = None
        self.unacked = 0
        self.window_full = False  # a flush stopped at PUSH_WINDOW: an ack must flush again
        self._auth_timer: asyncio.Task[None] | None = None
        token = _bearer(self.scope.get("headers", []))
        if token is not None:
            session = await _authenticate(token)
            if session is None:
                await self.close()  # before accept: the handshake is refused (HTTP 403)
                return
            await self.accept()
            await self._start(session)
            return
        await self.accept()
        self._auth_timer = asyncio.ensure_future(self._require_auth())

    async def _require_auth(self) -> None:
        await asyncio.sleep(AUTH_SECONDS)
        if self.session is None:
            await self._refuse('Send {"type": "auth", "token": ...} first.')

    async def _refuse(self, detail: str) -> None:
        await self.send_json({"type": "error", "error": "unauthorized", "detail": detail})
        await self.close(code=CLOSE_UNAUTHORIZED)

    async def _start(self, session: AgentSession) -> None:
        if not SOCKET_PLACES.take(session.id):
            await self.send_json(
                {
                    "type": "error",
                    "error": "rate_limited",
                    "reason": "too_many_sockets",
                    "detail": f"This session already has {settings.SWITCHBOARD_SOCKETS_PER_SESSION} "
                    "sockets open (the limit). Close one, or use the one you have.",
                }
            )
            await self.close(code=CLOSE_TOO_MANY_SOCKETS)
            return
        self.placed = session.id
        self.session = session
        self.subscription = await InboxSubscription.join(self.channel_layer, self.channel_name, session.id)
        # Read after joining: a close announced before the join is seen here, one after it arrives
        # as `session.closed` (and the flush below finds what was queued before, the wake-ups the rest).
        problem = await _socket_problem(session)
        if problem is not None:
            await self._close_session(problem)
            return
        await self.send_json({"type": "hello", "session": session_summary(session)})
        await self.flush()  # what was queued while no socket was connected

    async def disconnect(self, code: int) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        if self.placed is not None:
            SOCKET_PLACES.give_back(self.placed)
            self.placed = None
        if self.subscription is not None:
            await self.subscription.leave()

    async def flush(self) -> None:
        """Pull and push everything queued, in batches, until nothing is left."""
        assert self.session is not None
        for _ in range(MAX_BATCHES_PER_FLUSH):
            room = min(PUSH_BATCH, PUSH_WINDOW - self.unacked)
            self.window_full = room <= 0
            if self.window_full:
                return  # the client has not acked what it has; the rest waits in the database
            frames = await _pull(self.session, room)
            if not frames:
                return
            self.unacked += len(frames)
            await self.send_json({"type": "messages", "messages": frames})
            if len(frames) < room:
                return

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.closed:
            return  # frames that crossed the close: the session is gone
        kind = content.get("type") if isinstance(content, dict) else None
        if self.session is None:
            token = content.get("token") if kind == "auth" else None
            session = await _authenticate(token) if isinstance(token, str) else None
            if session is None:
                await self._refuse("That is not a valid session token.")
                return
            await self._start(session)
            return
        if kind == "ack":
            ids = content.get("ids")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                await self._error("invalid", 'An ack is {"type": "ack", "ids": [message id, ...]}.')
                return
            try:
                result = await _ack(self.session, ids)
            except SwitchboardError as exc:
                await self._error(exc.code, exc.detail)
                return
            await self.send_json({"type": "acked", **result})
            self.unacked = max(0, self.unacked - len(result["acked"]) - len(result["already_read"]))
            if self.window_full:
                await self.flush()  # the ack opened the window again: push what waited behind it
        elif kind == "ping":
            await _touch(self.session)  # a connected agent that pings is alive (not `dead`)
            await self.send_json({"type": "pong"})
        else:
            await self._error("invalid", "Frames are `ack` or `ping`.")

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "error": code, "detail": detail})

    async def _close_session(self, detail: str) -> None:
        """The session exited or was stopped: tell the client why and end the socket."""
        self.session = None
        self.closed = True
        await self.send_json({"type": "error", "error": "session_closed", "detail": detail})
        await self.close(code=CLOSE_SESSION_CLOSED)

    async def hub_event(self, event: dict[str, Any]) -> None:
        if self.session is None:
            return
        if event["kind"] == SESSION_CLOSED_EVENT:
            await self._close_session(closed_problem(event["data"].get("status")) or "")
        elif wakes_inbox(event):
            await self.flush()
        else:
            await self.send_json({"type": "event", "kind": event["kind"], "data": event["data"]})

    async def hub_events(self, message: dict[str, Any]) -> None:
        """Many events for this group at once (`announce_many`): each is handled as if alone."""
        for event in message["events"]:
            await self.hub_event(event)
