"""`POST /api/v1/messages` served straight from the API's ASGI handler, without ninja's operation
layer or Django's request cycle around it.

Sending is most of what agents do, and Django's handler and ninja's operation layer around the
service call (building and resolving the request, three hops between the event loop and the
request's thread, ninja's parameter and response models) cost a large share of a send's CPU
(the figures are in bench/results/history.md). This route does what a send needs in one hop to
the request's thread: it checks the bearer token with the API's own `BearerAuth`, parses the body with
the same checks and schema (`refuse_unstorable`, `SendIn`), calls the function the ninja view calls
(`messaging.api.send_answer`), shapes the answer with the view's response schema (`SendOut`), maps
errors with the API's `error_answer`, and adds the API's security headers.

Everything else goes, with the body replayed, to the full handler, so every other answer still
has one author: a request without a valid bearer token (ninja answers 401, or takes the console's
staff login), a body that is not JSON, holds text the database cannot store or fails the schema
(ninja's 400 with its list of problems), an SSL redirect. A body over the size limit never gets
here: the request guard in front of both handlers answers it 413 (`hub.request_guard`).
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.exception import response_for_exception
from django.core.signals import request_finished, request_started
from django.http import HttpResponse, HttpResponseBase
from ninja.errors import HttpError
from pydantic import ValidationError

from hub.api import api, error_answer, refuse_unstorable
from hub.api_asgi import SecurityCalls, app_path
from messaging.api import SendIn, SendOut, send_answer
from messaging.auth import BearerAuth
from messaging.principals import Principal

SEND_PATH = "/api/v1/messages"

Asgi = Callable[..., Awaitable[Any]]


class DirectSendRoute:
    """The direct route for `POST /api/v1/messages`; `fallback` is the full API handler."""

    def __init__(self) -> None:
        self._bearer = BearerAuth()
        self._security = SecurityCalls()
        self._answer_on_lane = sync_to_async(self._answer, thread_sensitive=True)

    def takes(self, scope: dict[str, Any]) -> bool:
        return scope.get("method") == "POST" and app_path(scope) == SEND_PATH

    async def __call__(self, scope: dict[str, Any], receive: Asgi, send: Asgi, *, fallback: Asgi) -> None:
        received, body = await _body_read(receive)
        if body is None:
            return  # the client left before sending its body, as Django's handler does
        request = ASGIRequest(scope, io.BytesIO(body))
        response = await self._answer_on_lane(request, body)
        if response is None:
            await fallback(scope, _replayed(received, receive), send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [(k.encode("ascii"), v.encode("latin1")) for k, v in response.items()],
            }
        )
        await send({"type": "http.response.body", "body": response.content})

    def _answer(self, request: ASGIRequest, body: bytes) -> HttpResponseBase | None:
        """On the request's thread, between the request signals Django sends (they hand the
        thread's database connection back to the pool): the answer, or None for the full handler."""
        request_started.send(sender=self.__class__, scope=request.scope)
        try:
            try:
                payload = self._sent(request, body)
                if payload is None:
                    return None
                status = 201
            except Exception as exc:
                answer = error_answer(exc)
                if answer is None:  # a fault in the hub: logged and answered as Django does
                    return self._security.headers_added(request, response_for_exception(request, exc))
                status, payload = answer
            response = HttpResponse(orjson.dumps(payload), status=status, content_type=api.get_content_type())
            return self._security.headers_added(request, response)
        finally:
            request_finished.send(sender=self.__class__)

    def _sent(self, request: ASGIRequest, body: bytes) -> dict[str, Any] | None:
        if self._security.redirect(request) is not None:
            return None
        caller = self._bearer(request)
        if not isinstance(caller, Principal):
            return None
        try:
            data = orjson.loads(body)
            refuse_unstorable(data)
            fields = SendIn.model_validate(data)
        except (orjson.JSONDecodeError, HttpError, ValidationError):
            return None
        return SendOut.model_validate(send_answer(caller, fields)).model_dump()


async def _body_read(receive: Asgi) -> tuple[list[dict[str, Any]], bytes | None]:
    """The body's ASGI messages as received, and the body, or None when the client disconnected.
    Its size is bounded in front of this route (`hub.request_guard`: a body over the limit
    is answered 413 there, and this route sees a disconnect)."""
    received: list[dict[str, Any]] = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] == "http.disconnect":
            return received, None
        if not message.get("more_body", False):
            return received, b"".join(m.get("body", b"") for m in received)


def _replayed(received: list[dict[str, Any]], receive: Asgi) -> Asgi:
    """A receive callable that gives back the messages already read, then reads on."""
    pending = list(received)

    async def replay() -> dict[str, Any]:
        return pending.pop(0) if pending else await receive()

    return replay
