"""Daphne's HTTP requests, bounded while they are received and fed to the application as it reads.

Twisted receives a whole request body (in memory below 100 kB, in a temporary file above) before
daphne starts the application, and daphne then puts all of it on the application's queue at once
(django/daphne#483): left so, a body costs the process its whole size in memory, even one the
application refuses. Here:

- the body's limit is known when the headers are (`gotLength`): the request line's path gives its
  route family (`hub.request_guard.body_limit`); a declared Content-Length over it is answered
  413 and the connection closed before a byte of the body is read, and a chunked body is counted
  as Twisted decodes it and cut off the same way at the limit;
- a body Twisted kept in a temporary file is not copied onto the queue: the application's
  `receive` reads it from that file, one chunk per call, as a streaming server would; a body kept
  in memory (under 100 kB, which is every send) goes as daphne sends it;
- Twisted does not parse form bodies: `Request` parses every POST that carries a Content-Type
  into `request.args`, which daphne never reads (work for nothing on every send);
  `parsePOSTFormSubmission=False` is a documented argument of `twisted.web.http.Request`.

Daphne has no setting for any of this, so `bound_daphne_requests` gives daphne's request class
and application start these steps (once per process; `hub.asgi` calls it).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from io import BytesIO
from typing import Any

from hub.request_guard import body_limit, too_large_detail

FEED_CHUNK = 64 * 1024  # bytes per `receive` when a body is read from its file


class _Fed:
    """Stands in for a body being fed from its file: daphne sees a closed content and leaves the
    body to the application's `receive` (its own loop would queue all of it)."""

    closed = True

    def read(self, size: int = -1) -> bytes:
        return b""

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def tell(self) -> int:
        return 0

    def close(self) -> None:
        pass


def bound_daphne_requests() -> bool:
    """Make daphne's requests bounded, fed from their file and free of form parsing; True if it
    applies (once per process). Does nothing with a daphne or Twisted that lacks what it needs."""
    from daphne import http_protocol, server
    from twisted.web.http import Request

    if getattr(http_protocol.WebRequest, "bounded", False):
        return True
    if "parsePOSTFormSubmission" not in inspect.signature(Request.__init__).parameters:
        return False

    class WebRequest(http_protocol.WebRequest):
        bounded = True
        skips_form_parsing = True
        body_limit = 0
        body_received = 0
        body_refused = False
        body_file: Any = None  # a body Twisted kept on disk, fed to the application from there

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("parsePOSTFormSubmission", False)
            super().__init__(*args, **kwargs)

        def gotLength(self, length: int | None) -> None:
            self.body_limit = body_limit(self._app_path())
            if length is not None and length > self.body_limit:
                self.requestHeaders.removeHeader(b"Expect")  # no "100 Continue" after the refusal
                self._refuse_body()
                self.content = BytesIO()
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:
            if self.body_refused:
                return
            self.body_received += len(data)
            if self.body_received > self.body_limit:
                self._refuse_body()
                return
            self.content.write(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
            if self.body_refused:
                return  # answered 413 already; the application never starts
            super().requestReceived(command, path, version)

        def process(self) -> Any:
            if not isinstance(self.content, BytesIO):
                self.body_file, self.content = self.content, _Fed()
            return super().process()

        def receive_for(self, queued: Callable[[], Awaitable[dict[str, Any]]]) -> Any:
            """The application's `receive`: the body from its file while any is left, then what
            daphne queues (a disconnect)."""
            body, size = self.body_file, self.body_received

            async def receive() -> dict[str, Any]:
                if body.closed:
                    return await queued()
                chunk = body.read(FEED_CHUNK)
                more = body.tell() < size
                if not more:
                    body.close()
                return {"type": "http.request", "body": chunk, "more_body": more}

            return receive

        def finish(self) -> None:
            self._close_body()
            super().finish()

        def connectionLost(self, reason: Any) -> None:
            self._close_body()
            super().connectionLost(reason)

        def _close_body(self) -> None:
            if self.body_file is not None:
                self.body_file.close()

        def _app_path(self) -> str:
            # Twisted keeps the request line's target on the channel until the body is in.
            target = getattr(self.channel, "_path", b"") or b""
            path = target.split(b"?", 1)[0].decode("latin-1")
            root = getattr(self.server, "root_path", "") or ""
            return path[len(root) :] if root and path.startswith(root) else path

        def _refuse_body(self) -> None:
            self.body_refused = True
            body = too_large_detail(self.body_limit)
            self.channel.transport.write(
                b"HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            self.channel.loseConnection()

    original_create = server.Server.create_application

    def create_application(self: Any, protocol: Any, scope: dict[str, Any]) -> Any:
        """daphne's, with the application's `receive` reading a body from its file when the
        request has one there (`WebRequest.receive_for`)."""
        if getattr(protocol, "body_file", None) is None:
            return original_create(self, protocol, scope)
        application = self.application

        def fed(*, scope: dict[str, Any], receive: Any, send: Any) -> Any:
            return application(scope=scope, receive=protocol.receive_for(receive), send=send)

        self.application = fed  # only while daphne makes this request's instance (no await between)
        try:
            return original_create(self, protocol, scope)
        finally:
            self.application = application

    # HTTPFactory.buildProtocol names the class through the module, on every new connection.
    http_protocol.WebRequest = WebRequest
    server.Server.create_application = create_application
    return True
