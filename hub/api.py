"""The one NinjaAPI: routers from each app under /api/v1/, one mapping from domain errors to HTTP."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

import orjson
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.renderers import BaseRenderer
from ninja.responses import NinjaJSONEncoder
from psycopg_pool import PoolTimeout

from federation.api import hub_answer_sign
from federation.api import router as federation_router
from hub.api_metrics import router as metrics_router
from messaging.api import router as messaging_router
from messaging.api_holds import router as holds_router
from messaging.errors import SwitchboardError
from messaging.storable import unstorable_text
from teams.api import router as teams_router


class StorableTextParser(Parser):
    """JSON bodies and query strings, refused with a 400 when they hold text the database cannot
    store (a NUL character) or that is not valid Unicode (a lone surrogate), instead of a 500 later."""

    def parse_body(self, request: HttpRequest) -> Any:
        data = super().parse_body(request)
        refuse_unstorable(data)  # raised inside ninja's body parsing: a 400 "Cannot parse request body"
        return data

    def parse_querydict(self, data: Any, list_fields: list[str], request: HttpRequest) -> Any:
        result = super().parse_querydict(data, list_fields, request)
        refuse_unstorable(result)
        return result


def refuse_unstorable(value: Any) -> None:
    """A 400 for a body or query holding text the database cannot store (`unstorable_text`)."""
    problem = unstorable_text(value)
    if problem is not None:
        raise HttpError(400, problem)


class CompactJSONRenderer(BaseRenderer):
    """Answers as ninja's JSON renderer writes them (datetimes to the millisecond with "Z", and
    whatever else its encoder knows), compact and encoded in C."""

    media_type = "application/json"
    _encoder = NinjaJSONEncoder()

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        # Datetimes go to the encoder (orjson would keep their microseconds and "+00:00").
        return orjson.dumps(
            data,
            default=self._encoder.default,
            option=orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS,
        )


# The docs page runs on the console's origin: scripts only from this hub (ninja's own Swagger UI
# files, under /static/ninja/). Swagger UI styles its elements inline, hence 'unsafe-inline' for styles.
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)


def docs_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """ninja's docs views, answered with DOCS_CONTENT_SECURITY_POLICY."""

    @wraps(view)
    def page(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response["Content-Security-Policy"] = DOCS_CONTENT_SECURITY_POLICY
        return response

    return page


class HubAPI(NinjaAPI):
    """ninja's API, with the answers to other hubs' signed requests signed for them
    (`federation.api.hub_answer_sign`): every answer the API renders, an error's too, is made here."""

    def create_response(
        self,
        request: HttpRequest,
        data: Any,
        *,
        status: int | None = None,
        temporal_response: HttpResponse | None = None,
    ) -> HttpResponse:
        response = super().create_response(request, data, status=status, temporal_response=temporal_response)
        hub_answer_sign(request, response)
        return response


api = HubAPI(
    title="Switchboard",
    version="1",
    description="A message hub for AI coding agents, with a human at the switchboard.",
    urls_namespace="api",
    docs_url="/docs",
    docs_decorator=docs_page,
    parser=StorableTextParser(),
    renderer=CompactJSONRenderer(),
)
api.add_router("/v1/", messaging_router)
api.add_router("/v1/", federation_router)
api.add_router("/v1/", holds_router)
api.add_router("/v1/", teams_router)
api.add_router("/v1/", metrics_router)


def error_answer(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """The status and body for an error a service call raised: a domain error, or the database
    being down. None for anything else (a fault in the hub). The ninja handlers below answer
    with it."""
    if isinstance(exc, SwitchboardError):
        return exc.status, exc.as_dict()
    if isinstance(exc, (OperationalError, InterfaceError)):
        # Never answer 2xx for something that was not committed. The database may have failed
        # while committing, after the change was made durable, so the answer cannot promise
        # "nothing was saved": it says how to retry safely instead.
        busy = isinstance(exc.__cause__, PoolTimeout)  # Django wraps the pool's own error
        return 503, {"error": "unavailable", "detail": HUB_BUSY_DETAIL if busy else DATABASE_DOWN_DETAIL}
    return None


@api.exception_handler(SwitchboardError)
@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def service_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    answer = error_answer(exc)
    assert answer is not None  # registered only for the errors it maps
    return api.create_response(request, answer[1], status=answer[0])


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    problems = [
        {"field": ".".join(str(p) for p in e.get("loc", [])[1:] or e.get("loc", [])), "problem": e.get("msg")}
        for e in exc.errors
    ]
    first = problems[0] if problems else {"field": "", "problem": "invalid input"}
    return api.create_response(
        request,
        {
            "error": "invalid",
            "reason": "schema",
            "detail": f"{first['field'] or 'body'}: {first['problem']}",
            "problems": problems,
        },
        status=400,
    )


@api.exception_handler(AuthenticationError)
def auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return api.create_response(
        request,
        {"error": "unauthorized", "detail": "Send a valid token as `Authorization: Bearer <token>`."},
        status=401,
    )


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja's own refusals (a body that is not JSON, a failed CSRF check), in the hub's error shape.
    code = {400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(
        exc.status_code, "error"
    )
    body = {"error": code, "detail": str(exc), **({"reason": "body"} if code == "invalid" else {})}
    return api.create_response(request, body, status=exc.status_code)


NOTHING_HERE = {"error": "not_found", "detail": "There is nothing here."}


@api.exception_handler(Http404)
def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return api.create_response(request, NOTHING_HERE, status=404)


@csrf_exempt
def no_such_path(request: HttpRequest) -> HttpResponse:
    """A path under /api/ that no operation serves: the API's 404, in its error shape (not the
    console's page), whatever the method, written by the API's renderer like its other answers."""
    return api.create_response(request, NOTHING_HERE, status=404)


@api.exception_handler(RequestDataTooBig)
def body_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return api.create_response(
        request,
        {"error": "too_large", "detail": "The request body is larger than the hub accepts."},
        status=413,
    )


_RETRY_SAFELY = (
    "this request may or may not have taken effect. Retry: a send with the same idempotency_key is "
    "stored once, and an inbox pull with include_unacked=true also returns messages handed over "
    "before the failure."
)
DATABASE_DOWN_DETAIL = f"The hub's database is unavailable; {_RETRY_SAFELY}"
HUB_BUSY_DETAIL = f"The hub is too busy: no database connection came free in time; {_RETRY_SAFELY}"
