"""The one NinjaAPI: routers from each app under /api/v1/, one mapping from domain errors to HTTP."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, ValidationError

from federation.api import router as federation_router
from messaging.api import router as messaging_router
from messaging.api_holds import router as holds_router
from messaging.errors import SwitchboardError
from teams.api import router as teams_router

api = NinjaAPI(
    title="Switchboard",
    version="1",
    description="A message hub for AI coding agents, with a human at the switchboard.",
    urls_namespace="api",
    docs_url="/docs",
)
api.add_router("/v1/", messaging_router)
api.add_router("/v1/", federation_router)
api.add_router("/v1/", holds_router)
api.add_router("/v1/", teams_router)


@api.exception_handler(SwitchboardError)
def domain_error(request: HttpRequest, exc: SwitchboardError) -> HttpResponse:
    return api.create_response(request, exc.as_dict(), status=exc.status)


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


@api.exception_handler(RequestDataTooBig)
def body_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return api.create_response(
        request,
        {"error": "too_large", "detail": "The request body is larger than the hub accepts."},
        status=413,
    )


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def database_down(request: HttpRequest, exc: DatabaseError) -> HttpResponse:
    # Never answer 2xx for something that was not committed: say so and let the caller retry.
    return api.create_response(
        request,
        {"error": "unavailable", "detail": "The hub's database is unavailable; nothing was saved. Retry."},
        status=503,
    )
