"""What every request must pass before any application code sees it: a Host this hub answers to
(ALLOWED_HOSTS, as Django's `get_host` checks it), a body no larger than its route family takes,
and for a browser's WebSocket an Origin equal to the hub's own (scheme, host and port).

These checks sit in front of both handlers (`hub.asgi`): the API's lean handler and its direct
send route never call Django's `get_host`, and Django's handler reads a whole body before any
middleware could refuse it. They cost a pass over the request's headers and a dictionary lookup;
a body's size is counted as it arrives only when no Content-Length bounds it (the server delivers
no more than a declared length). Under daphne the same limits also hold while Twisted receives
the body, before the application is started (`hub.daphne_requests`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.signals import setting_changed
from django.http.request import split_domain_port, validate_host

Asgi = Callable[..., Awaitable[Any]]

# Hub-to-hub and relay calls carry files as base64 inside a signed envelope: they take the
# largest bodies (federation.api.MAX_HUB_BODY). An upload's body is one file and its multipart frame.
HUB_PATHS = ("/api/v1/federation/", "/api/v1/relay/")
UPLOAD_PATH = "/api/v1/files"
MULTIPART_ALLOWANCE = 64 * 1024
_VERDICTS_KEPT = 256  # Host values remembered; a client that varies its Host is checked every time

_host_verdicts: dict[bytes | None, bool] = {}


def body_limit(path: str) -> int:
    """The most bytes a request body to `path` (below the hub's mount point) may have."""
    if path.startswith(HUB_PATHS):
        from federation.api import MAX_HUB_BODY

        return MAX_HUB_BODY
    if path == UPLOAD_PATH:
        from federation.services.files import upload_limit

        return upload_limit() + MULTIPART_ALLOWANCE
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def too_large_detail(limit: int) -> bytes:
    """The hub's `too_large` answer as JSON bytes (the same for the ASGI check and daphne's)."""
    return (
        b'{"error": "too_large", "detail": "The request body is larger than this route takes '
        b'(%d bytes).", "limit": %d}' % (limit, limit)
    )


def host_allowed(raw: bytes | None, scope: dict[str, Any]) -> bool:
    """Whether the request's Host (or, without one, the server's address, as Django takes it)
    names this hub: one of ALLOWED_HOSTS, with Django's rules (DEBUG with none set allows
    localhost). A DNS-rebinding page reaches the hub under its own name, which is refused."""
    verdict = _host_verdicts.get(raw)
    if verdict is None:
        verdict = _host_matches(raw, scope)
        if raw is not None and len(_host_verdicts) < _VERDICTS_KEPT:
            _host_verdicts[raw] = verdict
    return verdict


def _host_matches(raw: bytes | None, scope: dict[str, Any]) -> bool:
    if raw is None:
        server = scope.get("server") or ("unknown", None)
        host = str(server[0])
    else:
        try:
            host = raw.decode("ascii")
        except UnicodeDecodeError:
            return False
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def _forget_verdicts(*, setting: str, **_: Any) -> None:
    if setting in ("ALLOWED_HOSTS", "DEBUG", "USE_X_FORWARDED_HOST"):
        _host_verdicts.clear()


setting_changed.connect(_forget_verdicts)


def _raw_host(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The Host Django would check: X-Forwarded-Host when USE_X_FORWARDED_HOST is on, else Host."""
    host = forwarded = None
    for name, value in headers:
        if name == b"host":
            host = value
        elif name == b"x-forwarded-host":
            forwarded = value
    return forwarded if forwarded is not None and settings.USE_X_FORWARDED_HOST else host


class RequestGuard:
    """ASGI middleware for HTTP: a Host not in ALLOWED_HOSTS gets 400, a declared Content-Length
    over the route's limit gets 413 before a byte of the body is read, and a body without one
    (chunked) is counted as it is received: past the limit the client gets 413 and the
    application a disconnect, so no handler keeps reading."""

    def __init__(self, app: Asgi, path_of: Callable[[dict[str, Any]], str]) -> None:
        self.app = app
        self.path_of = path_of

    async def __call__(self, scope: dict[str, Any], receive: Asgi, send: Asgi) -> None:
        host = length = None
        headers = scope["headers"]
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"content-length":
                length = value
        if settings.USE_X_FORWARDED_HOST:
            host = _raw_host(headers)
        if not host_allowed(host, scope):
            await _answer(send, 400, HOST_REFUSED)
            return
        limit = body_limit(self.path_of(scope))
        if length is None:
            await self.app(scope, _counted(receive, send, limit), send)
        elif not length.isdigit() or int(length) > limit:
            await _answer(send, 413, too_large_detail(limit))
        else:
            await self.app(scope, receive, send)


HOST_REFUSED = (
    b'{"error": "invalid", "reason": "host", "detail": "This hub does not answer to that host name: '
    b'name it in SWITCHBOARD_ALLOWED_HOSTS to reach the hub under it."}'
)


def _counted(receive: Asgi, send: Asgi, limit: int) -> Asgi:
    """`receive`, counting body bytes: past `limit` it answers 413 itself and hands the
    application a disconnect instead of the chunk."""
    received = 0

    async def counted() -> dict[str, Any]:
        nonlocal received
        message = await receive()
        body = message.get("body")
        if body:
            received += len(body)
            if received > limit:
                await _answer(send, 413, too_large_detail(limit))
                return {"type": "http.disconnect"}
        return message

    return counted


async def _answer(send: Asgi, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"x-content-type-options", b"nosniff"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --- WebSockets -------------------------------------------------------------------------------------


def same_origin(scope: dict[str, Any], origin: bytes) -> bool:
    """Whether a WebSocket's Origin is the hub's own: same scheme, host and port as the URL the
    socket was opened on (its Host, which must be allowed), or one of CSRF_TRUSTED_ORIGINS (e.g.
    the public https origin of a hub behind a TLS proxy). Another port on the same host is
    another origin: any local dev server's page would otherwise read the socket."""
    try:
        text = origin.decode("ascii").lower()
    except UnicodeDecodeError:
        return False
    if text in {o.lower().rstrip("/") for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    host = _raw_host(scope.get("headers") or [])
    if host is None or not host_allowed(host, scope):
        return False
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    # An Origin or a Host that does not parse names no origin at all, so it matches nothing, not
    # even another that does not parse (`null` against a Host with a port out of range).
    theirs = _origin_tuple(text)
    ours = _origin_tuple(f"{scheme}://{host.decode('ascii').lower()}")
    return theirs is not None and ours is not None and theirs == ours


def _origin_tuple(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


class WebSocketGuard:
    """ASGI middleware for WebSockets: the Host must be allowed, and an Origin, when the route
    requires one (a browser's socket, authenticated by its cookie) or when one is sent (a page
    opening an agent socket), must be the hub's own. Refused handshakes get HTTP 403."""

    def __init__(self, app: Asgi, *, origin_required: bool) -> None:
        self.app = app
        self.origin_required = origin_required

    async def __call__(self, scope: dict[str, Any], receive: Asgi, send: Asgi) -> None:
        origin = None
        for name, value in scope.get("headers") or []:
            if name == b"origin":
                origin = value
        allowed = host_allowed(_raw_host(scope.get("headers") or []), scope)
        if allowed and origin is not None:
            allowed = same_origin(scope, origin)
        elif origin is None and self.origin_required:
            allowed = False
        if allowed:
            await self.app(scope, receive, send)
            return
        from channels.security.websocket import WebsocketDenier

        await WebsocketDenier()(scope, receive, send)
