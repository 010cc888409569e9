"""The REST API's own ASGI handler: Django's, with one middleware instead of the console's chain,
and each request's sync code run in one hop to the request's thread.

Under ASGI every classic (sync) middleware costs two hops to the request's worker thread and back,
one on the way in and one on the way out; the console's seven cost more than an authenticated no-op
call itself. API calls authenticate with bearer tokens in the view (django-ninja). The one cookie
path, a staff login acting as an operator (`messaging.auth.StaffLogin`, CSRF checked by ninja),
needs only `request.session` and `request.user`, which this middleware sets up lazily (nothing is
read until a view asks). The security headers come from the same Django middleware the console
uses, whose response hooks are called inline: they only set headers.

Django's ASGI cycle hops between the event loop and the request's thread three times for a sync
view (the request_started signal, the view, the response's close with request_finished) and runs
the view in a task beside one listening for a disconnect. Every API view but the long-polling
inbox is sync, so for those the handler reads the body on the loop and does the rest in one call
on the request's thread, as Django's WSGI handler does: request_started, the request object, the
middleware and the view (`BaseHandler.get_response`, with its exception handling and logging),
then the response's close (request_finished, which hands the thread's database connection back)
before the answer is written. An async view (and nothing else) goes through Django's own cycle.

Django runs each request's sync code (the view, signal receivers) on a thread of its own, made for
that request and joined after it. Here the threads are kept: a request borrows an idle one-thread
executor ("lane") and gives it back when it is answered, so a busy process reuses a handful of
threads instead of starting one per call. A lane still serves one request at a time, as Django's
per-request thread does, so what a view keeps in thread-locals (its database connection, closed or
returned to the pool at the end of every request) never leaks into another request.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from typing import IO, Any

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.core.signals import request_started
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, ResolverMatch, URLResolver, get_resolver, set_script_prefix
from django.utils.datastructures import CaseInsensitiveMapping
from django.utils.encoding import escape_uri_path, iri_to_uri
from django.utils.functional import SimpleLazyObject

API_PREFIX = "/api/"
IDLE_LANES_KEPT = 16  # threads kept for the next requests; more are made when more run at once
ROUTES_KEPT = 1024  # paths whose match is remembered (least recently used forgotten first)
ROUTE_KEPT_MAX_LENGTH = 256  # a longer path is resolved each time: a caller cannot fill memory with paths

Respond = Callable[[HttpRequest], HttpResponseBase]
RespondAsync = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


class SecurityCalls:
    """The console's security middleware called inline (it only reads the request and sets
    headers): the SSL redirect on the way in, when configured, and the security headers on the
    way out."""

    def __init__(self) -> None:
        self._security = SecurityMiddleware(_never_called)
        self._framing = XFrameOptionsMiddleware(_never_called)

    def redirect(self, request: HttpRequest) -> HttpResponseBase | None:
        return self._security.process_request(request)  # SECURE_SSL_REDIRECT, when configured

    def headers_added(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        """The security headers, and the body's length (as the console's CommonMiddleware sets it),
        so that an answer is not sent chunked."""
        if not response.streaming and not response.has_header("Content-Length"):
            response.headers["Content-Length"] = str(len(response.content))
        return self._framing.process_response(request, self._security.process_response(request, response))


def _never_called(request: HttpRequest) -> HttpResponseBase:
    raise AssertionError("SecurityCalls runs the middleware's hooks only")


def api_request_middleware(get_response: Any) -> Any:
    """Lazy session and user for the API, plus the console's security headers, without thread
    hops: async around an async `get_response` (Django's ASGI cycle), sync around a sync one (the
    one-hop cycle)."""
    session_store = import_module(settings.SESSION_ENGINE).SessionStore
    security = SecurityCalls()

    def redirect_or_prepared(request: HttpRequest) -> HttpResponseBase | None:
        redirect = security.redirect(request)
        if redirect is None:
            request.session = session_store(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
            request.user = SimpleLazyObject(lambda: get_user(request))
        return redirect

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponseBase:
            redirect = redirect_or_prepared(request)
            if redirect is not None:
                return redirect
            return security.headers_added(request, await get_response(request))

        markcoroutinefunction(middleware)
        return middleware

    def sync_middleware(request: HttpRequest) -> HttpResponseBase:
        redirect = redirect_or_prepared(request)
        if redirect is not None:
            return redirect
        return security.headers_added(request, get_response(request))

    return sync_middleware


def _only_middleware(handler: BaseHandler, view: Any) -> Any:
    """`handler`'s middleware chain: `api_request_middleware` around `view`, exceptions converted
    to responses on both sides as Django's own chain does."""
    handler._view_middleware = []
    handler._template_response_middleware = []
    handler._exception_middleware = []
    return convert_exception_to_response(api_request_middleware(convert_exception_to_response(view)))


RESOLVED = "switchboard.resolved"  # the scope's key for its path's match, resolved on the loop


class _SyncHandler(BaseHandler):
    """Django's sync request handling (`get_response`: URL resolution, the view, exception
    handling, the log of 4xx and 5xx answers) with the API's one middleware."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._middleware_chain = _only_middleware(self, self._get_response)

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        """The match the handler found for the path when it chose this cycle (the API sets no
        per-request urlconf), so a path is resolved once per request."""
        match = request.scope.pop(RESOLVED, None)  # type: ignore[attr-defined]
        if match is None:
            return super().resolve_request(request)
        request.resolver_match = match
        return match


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with `api_request_middleware` as its whole middleware chain, serving a
    sync view in one hop to a reused lane (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._idle_lanes: list[ThreadPoolExecutor] = []
        self._sync_handler = _SyncHandler()
        self._sync_handler.load_middleware()
        self._answered_on_lane = sync_to_async(self._answered, thread_sensitive=True)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"The API handler serves HTTP only, not {scope['type']}.")
        lane = self._idle_lanes.pop() if self._idle_lanes else ThreadPoolExecutor(1, "api-lane")
        try:
            async with ThreadSensitiveContext(executor=lane):
                if await self._hub_request_refused(scope, send):
                    return
                match, is_async = _route_of(app_path(scope))
                if is_async:
                    await self.handle(scope, receive, send)
                else:
                    scope[RESOLVED] = match  # with None the sync cycle resolves the path and answers 404
                    await self._handled_in_one_hop(scope, receive, send)
        finally:
            if len(self._idle_lanes) < IDLE_LANES_KEPT:
                self._idle_lanes.append(lane)
            else:
                lane.shutdown(wait=False)

    async def _handled_in_one_hop(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return  # the client left before sending its body, as Django's cycle does
        try:
            set_script_prefix(get_script_prefix(scope))
            response = await self._answered_on_lane(scope, body_file)
            await self.send_response(response, send)
            if response.streaming:  # its content was read while it was sent: closed only now
                await sync_to_async(response.close)()
        finally:
            body_file.close()

    def _answered(self, scope: dict[str, Any], body_file: IO[bytes]) -> HttpResponseBase:
        """On the request's thread: the response, closed unless it streams (the close sends
        request_finished, which hands the thread's database connection back)."""
        request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self._sync_handler.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # as Django's cycle: the server chunks
        if not response.streaming:
            response.close()
        return response

    async def _hub_request_refused(self, scope: dict[str, Any], send: Any) -> bool:
        """Answer a hub-to-hub request whose signature headers fail before a byte of its body is
        read (`federation.api.hub_request_early_answer`, signed for the calling hub); True when it
        was answered."""
        from federation.api import hub_request_early_answer
        from hub.request_guard import HUB_PATHS

        path = app_path(scope)
        if not path.startswith(HUB_PATHS):
            return False
        headers = CaseInsensitiveMapping(
            {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        )
        answer = await sync_to_async(hub_request_early_answer)(
            method=scope["method"].upper(), path=path, full_path=full_path(scope), headers=headers
        )
        if answer is None:
            return False
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer.body)).encode("ascii")),
                    (b"connection", b"close"),
                    *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})
        return True

    def load_middleware(self, is_async: bool = False) -> None:
        self._middleware_chain = _only_middleware(self, self._get_response_async)


def _route_of(path: str) -> tuple[ResolverMatch | None, bool]:
    """`_route` for the request's path in the current urlconf; a long path is not remembered."""
    resolver = get_resolver()
    if len(path) > ROUTE_KEPT_MAX_LENGTH:
        return _route.__wrapped__(resolver, path)
    return _route(resolver, path)


@functools.lru_cache(maxsize=ROUTES_KEPT)
def _route(resolver: URLResolver, path: str) -> tuple[ResolverMatch | None, bool]:
    """The match `path` has in `resolver` (None when no view serves it) and whether its view is
    async, which chooses the request's cycle. Remembered per resolver, so a changed urlconf (a new
    resolver) is resolved afresh. A match is shared by the requests for its path: the handler and
    the views only read it (Django passes its args and kwargs unpacked)."""
    try:
        match = resolver.resolve(path)
    except Resolver404:
        return None, False
    return match, iscoroutinefunction(match.func)


def full_path(scope: dict[str, Any]) -> str:
    """The request's path with its query, as Django's request for it gives it (`get_full_path`)."""
    query = scope.get("query_string", b"")
    query = query.decode("utf-8", "replace") if isinstance(query, bytes) else query
    return escape_uri_path(scope.get("path", "")) + (f"?{iri_to_uri(query)}" if query else "")


def is_api_request(scope: dict[str, Any]) -> bool:
    return app_path(scope).startswith(API_PREFIX)


def app_path(scope: dict[str, Any]) -> str:
    """The request's path below the hub's mount point (`root_path`)."""
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path
