"""The REST API's own ASGI handler: Django's, with one async middleware instead of the console's chain.

Under ASGI every classic (sync) middleware costs two hops to the request's worker thread and back,
one on the way in and one on the way out; the console's seven cost more than an authenticated no-op
call itself. API calls authenticate with bearer tokens in the view (django-ninja). The one cookie
path, a staff login acting as an operator (`messaging.auth.StaffLogin`, CSRF checked by ninja),
needs only `request.session` and `request.user`, which this middleware sets up lazily (nothing is
read until a view asks). The security headers come from the same Django middleware the console
uses, whose response hooks are called inline: they only set headers.

Django runs each request's sync code (the view, signal receivers) on a thread of its own, made for
that request and joined after it. Here the threads are kept: a request borrows an idle one-thread
executor ("lane") and gives it back when it is answered, so a busy process reuses a handful of
threads instead of starting one per call. A lane still serves one request at a time, as Django's
per-request thread does, so what a view keeps in thread-locals (its database connection, closed or
returned to the pool at the end of every request) never leaks into another request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from typing import Any

from asgiref.sync import ThreadSensitiveContext, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.datastructures import CaseInsensitiveMapping
from django.utils.functional import SimpleLazyObject

API_PREFIX = "/api/"
IDLE_LANES_KEPT = 16  # threads kept for the next requests; more are made when more run at once

Respond = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


class SecurityCalls:
    """The console's security middleware called inline (it only reads the request and sets
    headers): the SSL redirect on the way in, when configured, and the security headers on the
    way out. Shared by the API's middleware and the direct send route."""

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


def api_request_middleware(get_response: Respond) -> Respond:
    """Lazy session and user for the API, plus the console's security headers, without thread hops."""
    session_store = import_module(settings.SESSION_ENGINE).SessionStore
    security = SecurityCalls()

    async def middleware(request: HttpRequest) -> HttpResponseBase:
        redirect = security.redirect(request)
        if redirect is not None:
            return redirect
        request.session = session_store(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
        request.user = SimpleLazyObject(lambda: get_user(request))
        response = await get_response(request)
        return security.headers_added(request, response)

    markcoroutinefunction(middleware)
    return middleware


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with `api_request_middleware` as its whole middleware chain, running
    each request's sync code on a reused lane (see the module docstring). Sends go by the direct
    route (`hub.send_route`), which hands back to this handler what it does not serve."""

    def __init__(self) -> None:
        super().__init__()
        self._idle_lanes: list[ThreadPoolExecutor] = []
        from hub.send_route import DirectSendRoute  # it imports the API, which needs the apps loaded

        self._send_route = DirectSendRoute()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"The API handler serves HTTP only, not {scope['type']}.")
        lane = self._idle_lanes.pop() if self._idle_lanes else ThreadPoolExecutor(1, "api-lane")
        try:
            async with ThreadSensitiveContext(executor=lane):
                if await self._hub_request_refused(scope, send):
                    return
                if self._send_route.takes(scope):
                    await self._send_route(scope, receive, send, fallback=self.handle)
                else:
                    await self.handle(scope, receive, send)
        finally:
            if len(self._idle_lanes) < IDLE_LANES_KEPT:
                self._idle_lanes.append(lane)
            else:
                lane.shutdown(wait=False)

    async def _hub_request_refused(self, scope: dict[str, Any], send: Any) -> bool:
        """Answer a hub-to-hub request whose signature headers fail before a byte of its body is
        read (`federation.api.hub_request_early_answer`); True when it was answered."""
        from federation.api import hub_request_early_answer
        from hub.request_guard import HUB_PATHS

        path = app_path(scope)
        if not path.startswith(HUB_PATHS):
            return False
        headers = CaseInsensitiveMapping(
            {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        )
        answer = await sync_to_async(hub_request_early_answer)(path, headers)
        if answer is None:
            return False
        body = json.dumps(answer[1]).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": answer[0],
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode("ascii")),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return True

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        view = convert_exception_to_response(self._get_response_async)
        self._middleware_chain = convert_exception_to_response(api_request_middleware(view))


def is_api_request(scope: dict[str, Any]) -> bool:
    return app_path(scope).startswith(API_PREFIX)


def app_path(scope: dict[str, Any]) -> str:
    """The request's path below the hub's mount point (`root_path`)."""
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path
