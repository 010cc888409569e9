"""Answers between hubs: every hub-to-hub call is signed by the caller, and its answer by the hub
that answers, bound to the request it answers (`federation.services.signatures.answer_headers`).
Played against this hub as the hub that answers: its answers verify for the request they answer
and for no other, and what someone on the path gets it to sign (the genuine headers with another
body, another time, another path) answers no request the caller made.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from federation.models import Peer, RevocationMode
from federation.services.identity import hub_identity
from federation.services.signatures import (
    ANSWER_SIGNATURE_HEADER,
    HubRequest,
    answer_problem,
    request_sign,
)
from hub.asgi import application
from tests.federation.conftest import (
    OtherHub,
    _federation_dirs,  # noqa: F401  (autouse: registry, files, caches)
)


def _call(
    client: Any,
    caller: OtherHub,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    sent_body: bytes | None = None,
    sent_path: str | None = None,
    changed: dict[str, str] | None = None,
) -> tuple[HubRequest, Any]:
    """`caller` signs a request to this hub and it is sent through the test client; `sent_body`,
    `sent_path` and `changed` headers replace what goes on the wire (changed on the way). Returns
    the request as the caller signed it and the hub's answer."""
    request = request_sign(
        method=method,
        path=path,
        body=body,
        dest_key=hub_identity().public_key,
        key=caller.key,
        name=caller.name,
    )
    headers = {**request.claim.headers(), **(changed or {})}
    meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    response = client.generic(
        method,
        sent_path or path,
        data=body if sent_body is None else sent_body,
        content_type="application/json",
        **meta,
    )
    return request, response


def _problem(request: HubRequest, response: Any) -> str | None:
    """Why the caller of `request` would not take `response` as this hub's answer to it."""
    return answer_problem(
        request,
        status=response.status_code,
        body=response.content,
        headers=response.headers,
        dest_key=hub_identity().public_key,
    )


@pytest.mark.django_db
def test_the_hubs_answers_are_signed_for_the_request_they_answer(hub_client, register, sender_hub):
    """Given another hub asks this one whether it hosts bob, reports receipts, and forwards a
    message for a name nobody here has, then each answer (a 200 and an error made after the body
    was read) verifies as this hub's answer to that request, and to no other request."""
    register("bob")
    calls = [
        ("GET", "/api/v1/federation/agents?to=bob", b""),
        ("POST", "/api/v1/federation/receipts", b'{"receipts": []}'),
        ("POST", "/api/v1/federation/messages", json.dumps({"envelope": {"to": "x"}}).encode()),
    ]
    for method, path, body in calls:
        request, response = _call(hub_client, sender_hub, method, path, body)
        assert response.status_code in (200, 400), response.content
        assert _problem(request, response) is None, (path, response.status_code)
        again, _ = _call(hub_client, sender_hub, method, path, body)
        assert _problem(again, response) == "the answer to another request"


@pytest.mark.django_db
def test_what_someone_on_the_path_gets_signed_answers_no_request_the_caller_made(
    hub_client, register, sender_hub
):
    """Given someone on the path takes another hub's genuine request headers and sends them to
    this hub with another body, another time, or to another path, then this hub's (signed) error
    answers the request it got, and the calling hub, checking it against what it signed, refuses
    it: a genuine 401 or 404 cannot be passed off as the answer to the genuine request."""
    register("bob")
    receipts = "/api/v1/federation/receipts"
    body = b'{"receipts": []}'
    other_body = _call(hub_client, sender_hub, "POST", receipts, body, sent_body=b'{"receipts": [1]}')
    stale = _call(
        hub_client, sender_hub, "POST", receipts, body, changed={"X-Switchboard-Time": "1000000000"}
    )
    elsewhere = _call(hub_client, sender_hub, "POST", receipts, body, sent_path="/api/v1/relay/pull")
    for (request, response), status in ((other_body, 401), (stale, 401), (elsewhere, 404)):
        assert response.status_code == status, response.content
        assert response.headers.get(ANSWER_SIGNATURE_HEADER), "the hub signs its errors too"
        assert _problem(request, response).startswith("a signature that does not verify")


@pytest.mark.django_db
def test_an_answer_to_a_body_refused_past_the_cap_is_not_signed(hub_client, sender_hub, monkeypatch):
    """Given a request whose body passes the cap while this hub reads it, then its 413 is not
    signed: the body it rests on was never hashed, and bound to the headers alone it would pass
    for the answer to the genuine request those headers came with."""
    monkeypatch.setattr("federation.api.MAX_HUB_BODY", 16)
    body = json.dumps({"receipts": [{"message_id": "m", "state": "read"}]}).encode()
    request, response = _call(hub_client, sender_hub, "POST", "/api/v1/federation/receipts", body)
    assert response.status_code == 413
    assert _problem(request, response) == "unsigned"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_refusal_before_the_body_is_read_is_signed_for_the_caller(sender_hub):
    """Given a hub this hub revoked (mode `refuse`) forwards a message, then the ASGI handler's
    refusal, made before a byte of the body is read, is signed for that request: the calling hub
    takes the 403 as this hub's own (a genuine refusal still fails its forward at once)."""
    from asgiref.sync import sync_to_async

    await sync_to_async(Peer.objects.create)(
        public_key=sender_hub.public_key, revoked=True, revocation_mode=RevocationMode.REFUSE
    )
    path = "/api/v1/federation/messages"
    request = await sync_to_async(request_sign)(
        method="POST", path=path, body=b"{}", dest_key=hub_identity().public_key, key=sender_hub.key
    )
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as http:
        response = await http.post(path, content=b"{}", headers=request.claim.headers())
    assert response.status_code == 403 and response.json()["error"] == "peer_revoked"
    assert _problem(request, response) is None
