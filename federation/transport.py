"""Hub-to-hub HTTP: one signed JSON request, answered or raising a transient/permanent error.

Knows nothing of the ORM: it sends bytes and says what came back.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from federation.errors import PermanentError, TransientError, Unreachable
from federation.services.signatures import request_headers

API_PREFIX = "/api/v1"
SEALED_TYPE = "application/x-switchboard-sealed"  # a body sealed to the receiving hub's key


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
    sealed to `dest_key`) as is. Returns the JSON answer of a 2xx."""
    url = base_url.rstrip("/") + API_PREFIX + path
    if sealed is not None:
        data, content_type = sealed, SEALED_TYPE
    else:
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        content_type = "application/json"
    split = urlsplit(url)
    signed_path = split.path + (f"?{split.query}" if split.query else "")
    headers = request_headers(
        method=method,
        path=signed_path,
        body=data,
        dest_key=dest_key,
        public_url=settings.SWITCHBOARD_PUBLIC_URL,
    )
    headers["Content-Type"] = content_type
    try:
        response = httpx.request(
            method,
            url,
            content=data,
            headers=headers,
            timeout=timeout or settings.SWITCHBOARD_FEDERATION_TIMEOUT,
        )
    except httpx.ConnectError as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}"[:300]) from exc
    except httpx.HTTPError as exc:
        raise TransientError(f"{type(exc).__name__}: {exc}"[:300]) from exc
    try:
        answer = response.json() if response.content else None
    except ValueError:
        answer = {"error": "bad_json", "detail": response.text[:200]}
    if response.status_code >= 500 or response.status_code == 429:
        raise TransientError(
            f"HTTP {response.status_code}: {answer!r}"[:300], status=response.status_code, body=answer
        )
    if response.status_code >= 400:
        raise PermanentError(response.status_code, answer)
    return answer
