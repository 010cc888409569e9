"""`POST /api/v1/messages` through the hub's ASGI application: each kind of request gets its status,
the hub's error shape and the API's headers; repeated sends are answered as duplicates, from their
idempotency key or refused past the pair's rate; bodies over the limit are refused 413 before any
handler; failures in the service answer 503 (the database) or 500 (a fault)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.core.signals import request_started
from django.db import OperationalError
from django.urls import get_resolver
from ninja.renderers import JSONRenderer

import hub.asgi
from messaging.principals import HUB
from messaging.services.operator_tokens import operator_token_create
from messaging.services.sessions import session_register

pytestmark = [pytest.mark.django_db(transaction=True)]


@sync_to_async
def sender_token() -> str:
    session_register(name="bob")
    return session_register(name="alice").token


@pytest.fixture
def handlers_started() -> Iterator[list[str]]:
    """The class name of each handler that started a request (request_started's sender)."""
    started: list[str] = []

    def note(sender: type, **_: Any) -> None:
        started.append(sender.__name__)

    request_started.connect(note)
    yield started
    request_started.disconnect(note)


async def post(token: str | None, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.ASGITransport(app=hub.asgi.application)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        return await http.post("/api/v1/messages", content=body, headers=headers)


def json_body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


# Each case: the token to send ("sender", "operator", None or a literal), the body, and the answer
# expected: status, `error`, `reason` (None where the answer has none).
CASES: dict[str, tuple[str | None, bytes, tuple[int, str | None, str | None]]] = {
    "accepted": ("sender", json_body(to="bob", message="hello"), (201, None, None)),
    "urgent, with a summary": (
        "sender",
        json_body(to="bob", message="x", summary="s", priority="urgent"),
        (201, None, None),
    ),
    "unknown recipient": ("sender", json_body(to="nobody-here", message="hi"), (404, "not_found", None)),
    "to itself": ("sender", json_body(to="alice", message="hi"), (400, "invalid", "self_target")),
    "empty message": ("sender", json_body(to="bob", message="   "), (400, "invalid", "empty_message")),
    "reply to an unknown message": (
        "sender",
        json_body(to="bob", message="re", in_reply_to=str(uuid.UUID(int=7))),
        (404, "not_found", "in_reply_to"),
    ),
    "operator token": ("operator", json_body(to="bob", message="hi"), (403, "forbidden", None)),
    "no token": (None, json_body(to="bob", message="hi"), (401, "unauthorized", None)),
    "unknown token": ("sb_not-a-token", json_body(to="bob", message="hi"), (401, "unauthorized", None)),
    "body not JSON": ("sender", b"{to: bob", (400, "invalid", "body")),
    "body a JSON list": ("sender", b"[1, 2]", (400, "invalid", "schema")),
    "missing field": ("sender", json_body(to="bob"), (400, "invalid", "schema")),
    "bad priority": ("sender", json_body(to="bob", message="x", priority="now"), (400, "invalid", "schema")),
    "NUL in text": ("sender", json_body(to="bob", message="a\x00b"), (400, "invalid", "body")),
    "lone surrogate": ("sender", b'{"to": "bob", "message": "\\ud800"}', (400, "invalid", "body")),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(CASES))
async def test_each_kind_of_send_gets_its_answer_with_the_apis_headers(case: str) -> None:
    who, body, (status, error, reason) = CASES[case]
    token = {
        "sender": await sender_token(),
        "operator": await sync_to_async(operator_token_create)(name="ops", actor=HUB),
    }
    answer = await post(token.get(who, who) if who else None, body)
    assert answer.status_code == status, answer.text
    data = answer.json()
    if status == 201:
        assert data["to"]["name"] == "bob" and data["duplicate"] is False
        assert set(data) == {"id", "status", "to", "result", "hint", "tier", "trust", "duplicate"}
    else:
        assert (data["error"], data.get("reason")) == (error, reason), data
        assert data["detail"]
    if reason == "schema":
        assert data["problems"] and {"field", "problem"} <= set(data["problems"][0])
    assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
    assert answer.headers["Content-Length"] == str(len(answer.content))  # never sent chunked
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert answer.headers["X-Frame-Options"] == "DENY"


@pytest.mark.asyncio
async def test_repeated_sends_are_duplicates_idempotent_conflicting_then_rate_limited(settings: Any) -> None:
    settings.SWITCHBOARD_RATE_PAIR = 3
    token = await sender_token()
    sequence = [
        json_body(to="bob", message="same text"),
        json_body(to="bob", message="same text"),  # a duplicate within the dedupe window
        json_body(to="bob", message="keyed", idempotency_key="k-1"),
        json_body(to="bob", message="keyed", idempotency_key="k-1"),  # the earlier answer again
        json_body(to="bob", message="keyed, changed", idempotency_key="k-1"),  # a conflict
        json_body(to="bob", message="fourth"),
        json_body(to="bob", message="fifth"),  # over the pair's rate
    ]
    answers = [await post(token, body) for body in sequence]
    statuses = [a.status_code for a in answers]
    assert statuses[:4] == [201, 201, 201, 201] and statuses[-1] == 429, statuses
    assert answers[1].json()["duplicate"] is True and answers[1].json()["id"] == answers[0].json()["id"]
    assert answers[3].json()["id"] == answers[2].json()["id"]
    assert answers[4].status_code == 409, answers[4].text
    assert answers[-1].json()["error"] == "rate_limited"


@pytest.mark.asyncio
async def test_a_body_over_the_upload_limit_is_refused_413_before_any_handler(
    settings: Any, handlers_started: list[str]
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    token = await sender_token()
    declared = await post(token, json_body(to="bob", message="x" * 2000))
    assert declared.status_code == 413 and declared.json()["error"] == "too_large"
    assert handlers_started == []  # the request guard in front answered (hub.request_guard)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "failure, status, error",
    [(OperationalError("the database went away"), 503, "unavailable"), (RuntimeError("a bug"), 500, None)],
)
async def test_failures_in_the_service_answer_503_for_the_database_and_500_for_a_fault(
    failure: Exception, status: int, error: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*_: Any, **__: Any) -> None:
        raise failure

    monkeypatch.setattr("messaging.services.together.message_send", failing)
    monkeypatch.setattr("messaging.services.together.messages_send", failing)
    answer = await post(await sender_token(), json_body(to="bob", message="m"))
    assert answer.status_code == status
    assert answer.headers["X-Frame-Options"] == "DENY"
    if error:
        assert answer.json()["error"] == error


@pytest.mark.asyncio
async def test_a_body_sent_in_parts_over_the_limit_is_refused_413_and_within_it_is_sent() -> None:
    """Without a Content-Length, the body is counted as it arrives and refused past the limit."""
    from django.test import override_settings

    token = await sender_token()
    parts = [b'{"to": "bob", ', b'"message": "', b"y" * 600, b'"}']
    inbox: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await asyncio.Event().wait()  # the client stays connected, as a real one does
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def sent_in_parts() -> None:
        inbox[:] = [
            {"type": "http.request", "body": b, "more_body": i < len(parts) - 1} for i, b in enumerate(parts)
        ]
        sent.clear()
        await hub.asgi.application(scope, receive, send)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/messages",
        "raw_path": b"/api/v1/messages",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("localhost", 80),
        "client": ("127.0.0.1", 5000),
        "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())],
    }
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=300):
        await sent_in_parts()
    assert sent[0]["status"] == 413
    assert len(inbox) == 1  # reading stopped at the limit: the last part was never taken
    await sent_in_parts()  # within the default limit
    assert sent[0]["status"] == 201, sent
    assert orjson.loads(sent[1]["body"])["to"]["name"] == "bob"


@pytest.mark.asyncio
async def test_a_path_is_resolved_once_by_the_api_handler_and_remembered(
    monkeypatch: pytest.MonkeyPatch, handlers_started: list[str]
) -> None:
    from hub.api_asgi import _route

    token = await sender_token()
    _route.cache_clear()
    root = get_resolver()
    resolved: list[str] = []
    resolve = type(root).resolve

    def counted(self: Any, path: str) -> Any:
        if self is root:
            resolved.append(path)
        return resolve(self, path)

    monkeypatch.setattr(type(root), "resolve", counted)
    answer = await post(token, json_body(to="bob", message="once"))
    assert answer.status_code == 201, answer.text
    assert handlers_started == ["ApiHandler"]
    assert resolved == ["/api/v1/messages"]
    answer = await post(token, json_body(to="bob", message="again"))
    assert answer.status_code == 201, answer.text
    assert resolved == ["/api/v1/messages"]  # the second request reused the first one's match


@pytest.mark.asyncio
async def test_unknown_paths_cannot_fill_the_remembered_routes() -> None:
    """A path no view serves is answered 404 either way; only short paths are remembered, so
    callers sending long made-up paths do not grow the handler's memory."""
    from hub.api_asgi import ROUTE_KEPT_MAX_LENGTH, _route

    _route.cache_clear()
    transport = httpx.ASGITransport(app=hub.asgi.application)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        for i in range(5):
            answer = await http.get(f"/api/v1/{'x' * ROUTE_KEPT_MAX_LENGTH}{i}")
            assert answer.status_code == 404
        assert _route.cache_info().currsize == 0
        assert (await http.get("/api/v1/no-such-thing")).status_code == 404
    assert _route.cache_info().currsize == 1


def test_the_apis_renderer_writes_what_ninjas_json_renderer_writes() -> None:
    """Datetimes (Django's format: milliseconds, "Z"), UUIDs, decimals, dates, nested values."""
    from hub.api import CompactJSONRenderer

    data = {
        "at": datetime(2026, 12, 5, 22, 26, 50, 398557, tzinfo=UTC),
        "local": datetime(2026, 12, 5, 23, 26, 50, tzinfo=timezone(timedelta(hours=1))),
        "day": date(2026, 12, 5),
        "id": uuid.UUID(int=7),
        "amount": Decimal("1.50"),
        "nested": [{"text": "é\u2028", "n": 1, "f": 0.5, "none": None, "flag": True}],
    }
    ours = CompactJSONRenderer().render(None, data, response_status=200)  # type: ignore[arg-type]
    ninjas = JSONRenderer().render(None, data, response_status=200)  # type: ignore[arg-type]
    assert orjson.loads(ours) == orjson.loads(ninjas)
    assert orjson.loads(ours)["at"] == "2026-12-05T22:26:50.398Z"
