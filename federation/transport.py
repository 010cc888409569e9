"""Hub-to-hub HTTP: one signed JSON request, answered or raising a transient/permanent error.
An answer counts only when the hub called signed it for that request; any other is no answer.

Knows nothing of the ORM: it sends bytes and says what came back (a refused answer is announced on
`answer_refused` for whoever records it).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.dispatch import Signal

from federation.errors import PermanentError, ReplayedRequest, TransientError, Unreachable, UnverifiedAnswer
from federation.services.signatures import answer_problem, request_sign
from messaging.storable import unstorable_text

API_PREFIX = "/api/v1"
SEALED_TYPE = "application/x-switchboard-sealed"  # a body sealed to the receiving hub's key
# The most a hub-to-hub body carries, either way: 200 MB of files as base64, plus the envelope. A
# hub reads no more of a request (`federation.api`) nor of an answer (`hub_call`): the relay's
# largest pull answer, one 80 MB message and a receipt batch as base64, fits with room to spare.
MAX_HUB_BODY = 280 * 1024 * 1024
# Room for the JSON values of a hub-to-hub body besides a message's text (summary, names, files,
# receipts, lease names, claim ids): far more than any hub puts in one.
JSON_VALUES_ROOM = 100_000
# Sent by `hub_call` for every answer it refuses (`answer_problem`), with dest_key, url, path,
# status (as claimed) and problem: whoever keeps the record (the audit) listens.
answer_refused = Signal()


class RefusedBody(ValueError):
    """A hub-to-hub body this hub never takes, however often it comes (`hub_json`): the API answers
    400 with `reason`; a relay item is dropped."""

    reason = "refused_body"


class TooManyValues(RefusedBody):
    """A hub-to-hub body holds more JSON values than any hub body does."""

    reason = "too_many_values"


class UnstorableText(RefusedBody):
    """A hub-to-hub body holds text the database cannot store (`messaging.storable`)."""

    reason = "unstorable_text"


def hub_json(raw: bytes) -> Any:
    """The JSON of a hub-to-hub body: a request, a sealed forward, a relay item, an answer.
    TooManyValues, before parsing, when it holds more values than any hub body does (a message's
    text of at most SWITCHBOARD_MAX_MESSAGE_CHARS, all of it `,[{` at worst, and JSON_VALUES_ROOM
    for the rest; counted from those characters, which every value after the first needs one of).
    Parsed, a tiny value (`{}`) takes some twenty times its bytes: a 280 MB body of them, which
    any key may sign and anyone may seal to this hub, would take gigabytes. UnstorableText when
    it holds text the database cannot store (a NUL character), as the API refuses it from agents."""
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if values > settings.SWITCHBOARD_MAX_MESSAGE_CHARS + JSON_VALUES_ROOM:
        raise TooManyValues(f"The body holds some {values} JSON values, more than any hub-to-hub body does.")
    data = json.loads(raw)
    problem = unstorable_text(data)
    if problem is not None:
        raise UnstorableText(problem)
    return data


def hub_call(
    method: str,
    base_url: str,
    path: str,
    body: Any = None,
    *,
    dest_key: str,
    sealed: bytes | None = None,
    timeout: float | None = None,
) -> Any:
    """Call `base_url` + /api/v1 + `path` as this hub, signed once for the hub holding `dest_key`
    (it refuses a request signed for another). The body is `body` as JSON, or `sealed` (bytes
    sealed to `dest_key`) as is. Returns the JSON answer of a 2xx.

    Only an answer signed by `dest_key` for this very request counts (`answer_problem`): anything
    else, whoever wrote it, is UnverifiedAnswer (no answer, retried like one), announced once on
    `answer_refused`. A 4xx so signed is PermanentError, except `replayed_request`: a copy of this
    request reached the hub first (it was sent twice on the way), so it is transient too."""
    url = base_url.rstrip("/") + API_PREFIX + path
    if sealed is not None:
        data, content_type = sealed, SEALED_TYPE
    else:
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        content_type = "application/json"
    split = urlsplit(url)
    signed_path = split.path + (f"?{split.query}" if split.query else "")
    request = request_sign(
        method=method,
        path=signed_path,
        body=data,
        dest_key=dest_key,
        public_url=settings.SWITCHBOARD_PUBLIC_URL,
    )
    headers = request.claim.headers()
    headers["Content-Type"] = content_type
    try:
        with httpx.stream(
            method,
            url,
            content=data,
            headers=headers,
            timeout=timeout or settings.SWITCHBOARD_FEDERATION_TIMEOUT,
        ) as response:
            content = answer_read(response)
    except httpx.ConnectError as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}"[:300]) from exc
    except httpx.HTTPError as exc:
        raise TransientError(f"{type(exc).__name__}: {exc}"[:300]) from exc
    status = response.status_code
    problem = answer_problem(
        request, status=status, body=content, headers=response.headers, dest_key=dest_key
    )
    if problem is not None:
        answer_refused.send_robust(
            sender=hub_call, dest_key=dest_key, url=base_url, path=split.path, status=status, problem=problem
        )
        raise UnverifiedAnswer(
            f"the answer (HTTP {status}) is not the hub's own, so it counts as no answer: {problem}"[:300],
            problem=problem,
        )
    try:
        answer = hub_json(content) if content else None
    except (ValueError, RecursionError):
        answer = {"error": "bad_json", "detail": content[:200].decode("utf-8", "replace")}
    replayed = status == 401 and isinstance(answer, dict) and answer.get("error") == ReplayedRequest.code
    if status >= 500 or status == 429 or replayed:
        raise TransientError(f"HTTP {status}: {answer!r}"[:300], status=status, body=answer)
    if status >= 400:
        raise PermanentError(status, answer)
    return answer


def answer_read(response: httpx.Response) -> bytes:
    """The answer's body, read in chunks up to MAX_HUB_BODY: whoever answers (the relay, another
    hub, anything at their URL) chooses its size, so a larger one is refused, as no answer
    (TransientError), before it fills this hub's memory."""
    declared = response.headers.get("Content-Length", "")
    too_large = f"the answer is larger than a hub-to-hub body may be ({MAX_HUB_BODY} bytes)"
    if declared.isdigit() and int(declared) > MAX_HUB_BODY:
        raise TransientError(too_large)
    parts: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_HUB_BODY:
            raise TransientError(too_large)
        parts.append(chunk)
    return b"".join(parts)
