"""The direct send route (`hub.send_route`) answers `POST /api/v1/messages` exactly as the full
API handler does: every case below is sent once through each, each with its own pair of sessions,
and the status, the JSON body (identifiers aside) and the headers must match. The route must also
really be taken for the sends it serves, and hand everything else over."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.core.signals import request_started
from django.db import OperationalError

import hub.asgi
from hub.send_route import DirectSendRoute
from messaging.auth import operator_token_create
from messaging.services.sessions import session_register

pytestmark = [pytest.mark.django_db(transaction=True)]

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Pair:
    path: str  # "fast" or "full": the suffix of this pair's session names
    sender_token: str
    names: dict[str, str]  # identifier of this path's sessions → placeholder
    operator_token: str = ""


@sync_to_async
def pair_for(path: str) -> Pair:
    alice = session_register(name=f"alice-{path}")
    bob = session_register(name=f"bob-{path}")
    names = {}
    for placeholder, reg in (("alice", alice), ("bob", bob)):
        s = reg.session
        names.update(
            {str(s.id): f"<{placeholder}-id>", s.ref: f"<{placeholder}-ref>", s.name: f"<{placeholder}>"}
        )
    return Pair(path=path, sender_token=alice.token, names=names)


@pytest.fixture
def handlers_seen() -> Iterator[list[str]]:
    """The class that started each request: DirectSendRoute, or the full handler (ApiHandler)."""
    seen: list[str] = []

    def note(sender: type, **_: Any) -> None:
        seen.append(sender.__name__)

    request_started.connect(note)
    yield seen
    request_started.disconnect(note)


@pytest.fixture
def full_handler_only(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Call to make the API handler stop using the direct route (every send goes through ninja)."""

    def switch() -> None:
        monkeypatch.setattr(hub.asgi.api_asgi_app._send_route, "takes", lambda scope: False)

    return switch


async def post(token: str | None, body: bytes, **headers: str) -> httpx.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.ASGITransport(app=hub.asgi.application)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        return await http.post("/api/v1/messages", content=body, headers=headers)


def comparable(response: httpx.Response, pair: Pair) -> dict[str, Any]:
    text = response.text
    for identifier, placeholder in pair.names.items():
        text = text.replace(identifier, placeholder)
    text = UUID.sub("<message-id>", text)
    is_json = response.headers.get("content-type", "").startswith("application/json")
    assert response.headers.get("content-length") == str(len(response.content))  # never chunked
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}  # names differ
    return {
        "status": response.status_code,
        "body": orjson.loads(text) if is_json else text,
        "headers": headers,
    }


def json_body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


# Each case: how to make the request for a path's pair, and whether the direct route serves it.
CASES: dict[str, tuple[Any, bool]] = {
    "accepted": (lambda p: (p.sender_token, json_body(to="bob-" + p.path, message="hello")), True),
    "urgent, with a summary": (
        lambda p: (
            p.sender_token,
            json_body(to="bob-" + p.path, message="x", summary="s", priority="urgent"),
        ),
        True,
    ),
    "unknown recipient": (lambda p: (p.sender_token, json_body(to="nobody-here", message="hi")), True),
    "to itself": (lambda p: (p.sender_token, json_body(to="alice-" + p.path, message="hi")), True),
    "empty message": (lambda p: (p.sender_token, json_body(to="bob-" + p.path, message="   ")), True),
    "reply to an unknown message": (
        lambda p: (
            p.sender_token,
            json_body(to="bob-" + p.path, message="re", in_reply_to=str(uuid.UUID(int=7))),
        ),
        True,
    ),
    "operator token": (lambda p: (p.operator_token, json_body(to="bob-" + p.path, message="hi")), True),
    "no token": (lambda p: (None, json_body(to="bob-" + p.path, message="hi")), False),
    "unknown token": (lambda p: ("sb_not-a-token", json_body(to="bob-" + p.path, message="hi")), False),
    "body not JSON": (lambda p: (p.sender_token, b"{to: bob"), False),
    "body a JSON list": (lambda p: (p.sender_token, b"[1, 2]"), False),
    "missing field": (lambda p: (p.sender_token, json_body(to="bob-" + p.path)), False),
    "bad priority": (
        lambda p: (p.sender_token, json_body(to="bob-" + p.path, message="x", priority="now")),
        False,
    ),
    "NUL in text": (lambda p: (p.sender_token, json_body(to="bob-" + p.path, message="a\x00b")), False),
    "lone surrogate": (lambda p: (p.sender_token, b'{"to": "bob", "message": "\\ud800"}'), False),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(CASES))
async def test_the_direct_route_answers_as_the_full_handler(
    case: str, handlers_seen: list[str], full_handler_only: Any
) -> None:
    make, served_directly = CASES[case]
    operator_token = await sync_to_async(operator_token_create)(name="ops")
    answers = {}
    for path in ("fast", "full"):
        if path == "full":
            full_handler_only()
        pair = await pair_for(path)
        pair.operator_token = operator_token
        handlers_seen.clear()
        token, body = make(pair)
        answers[path] = comparable(await post(token, body, **{"Content-Type": "application/json"}), pair)
        expected = ["DirectSendRoute"] if path == "fast" and served_directly else ["ApiHandler"]
        if path == "fast" and not served_directly:
            expected = ["DirectSendRoute", "ApiHandler"]  # looked at, then handed over with its body
        assert handlers_seen == expected, (path, handlers_seen)
    assert answers["fast"] == answers["full"]
    assert answers["fast"]["status"] in (201, 400, 401, 403, 404), answers["fast"]


@pytest.mark.asyncio
async def test_repeated_sends_answer_alike_duplicate_idempotent_and_rate_limited(
    settings: Any, full_handler_only: Any
) -> None:
    settings.SWITCHBOARD_RATE_PAIR = 3
    answers = {}
    for path in ("fast", "full"):
        if path == "full":
            full_handler_only()
        pair = await pair_for(path)
        to = "bob-" + path
        sequence = [
            json_body(to=to, message="same text"),
            json_body(to=to, message="same text"),  # a duplicate within the dedupe window
            json_body(to=to, message="keyed", idempotency_key="k-1"),
            json_body(to=to, message="keyed", idempotency_key="k-1"),  # the earlier answer again
            json_body(to=to, message="keyed, changed", idempotency_key="k-1"),  # a conflict
            json_body(to=to, message="fourth"),
            json_body(to=to, message="fifth"),  # over the pair's rate
        ]
        answers[path] = [comparable(await post(pair.sender_token, body), pair) for body in sequence]
    assert answers["fast"] == answers["full"]
    statuses = [a["status"] for a in answers["fast"]]
    assert statuses[:4] == [201, 201, 201, 201] and statuses[-1] == 429, statuses
    assert answers["fast"][1]["body"]["duplicate"] is True


@pytest.mark.asyncio
async def test_a_body_over_the_upload_limit_is_refused_413_before_either_handler(
    settings: Any, handlers_seen: list[str]
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    pair = await pair_for("fast")
    declared = await post(pair.sender_token, json_body(to="bob-fast", message="x" * 2000))
    assert declared.status_code == 413 and declared.json()["error"] == "too_large"
    assert handlers_seen == []  # the request guard in front answered (hub.request_guard)


@pytest.mark.asyncio
async def test_a_body_sent_in_parts_over_the_limit_is_refused_413() -> None:
    """Without a Content-Length, the body is counted as it arrives and refused past the limit."""
    from django.test import override_settings

    pair = await pair_for("fast")
    parts = [b'{"to": "bob-fast", ', b'"message": "', b"y" * 600, b'"}']
    sent: list[dict[str, Any]] = []
    inbox = [
        {"type": "http.request", "body": b, "more_body": i < len(parts) - 1} for i, b in enumerate(parts)
    ]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await asyncio.Event().wait()  # the client stays connected, as a real one does
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

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
        "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {pair.sender_token}".encode())],
    }
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=300):
        await hub.asgi.application(scope, receive, send)
    assert sent[0]["status"] == 413
    assert len(inbox) == 1  # reading stopped at the limit: the last part was never taken
    inbox.clear()
    inbox.extend(
        {"type": "http.request", "body": b, "more_body": i < len(parts) - 1} for i, b in enumerate(parts)
    )
    sent.clear()
    await hub.asgi.application(scope, receive, send)  # within the default limit: sent directly
    assert sent[0]["status"] == 201, sent
    assert orjson.loads(sent[1]["body"])["to"]["name"] == "bob-fast"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "failure, status", [(OperationalError("the database went away"), 503), (RuntimeError("a bug"), 500)]
)
async def test_failures_in_the_service_answer_as_the_full_handler(
    failure: Exception, status: int, monkeypatch: pytest.MonkeyPatch, full_handler_only: Any
) -> None:
    def failing(_request: Any) -> None:
        raise failure

    monkeypatch.setattr("messaging.services.together.message_send", failing)
    answers = {}
    for path in ("fast", "full"):
        if path == "full":
            full_handler_only()
        pair = await pair_for(path)
        answers[path] = comparable(
            await post(pair.sender_token, json_body(to="bob-" + path, message="m")), pair
        )
    assert answers["fast"] == answers["full"]
    assert answers["fast"]["status"] == status


def test_the_route_takes_only_posts_to_the_send_path() -> None:
    route = DirectSendRoute()
    assert route.takes({"method": "POST", "path": "/api/v1/messages"})
    assert route.takes({"method": "POST", "path": "/hub/api/v1/messages", "root_path": "/hub"})
    assert not route.takes({"method": "GET", "path": "/api/v1/messages"})
    assert not route.takes({"method": "POST", "path": "/api/v1/messages/batch"})
    assert not route.takes({"method": "POST", "path": "/api/v1/messages/"})
