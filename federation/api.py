"""Hub-to-hub endpoints (`/api/v1/federation/...`), relay endpoints (`/api/v1/relay/...`) and the
operator's peer controls. Hub calls are authenticated by a request signature (the caller's hub
key), never by a session token; the body is read raw so large envelopes skip the JSON form limit."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema, Status

from federation.models import FederationTier
from federation.services.files import file_upload
from federation.services.forwarding import (
    envelope_open,
    hosts_answer,
    inbound_accept,
    local_agents_public,
)
from federation.services.identity import hub_identity
from federation.services.keys import keys_refused_recently
from federation.services.peers import (
    PEERS_PAGE,
    peer_pin,
    peer_refusal,
    peer_restore,
    peer_revoke,
    peer_seen,
    peer_vouched_tier,
    peers_page,
)
from federation.services.receipts import receipts_from_hub
from federation.services.relay import (
    relay_agents,
    relay_claim,
    relay_claim_finish,
    relay_claims_finish,
    relay_lease_release,
    relay_lease_take,
    relay_lookup,
    relay_pull,
    relay_store,
    require_relay,
)
from federation.services.signatures import (
    BODY_NOT_READ,
    NAME_HEADER,
    URL_HEADER,
    HubRequest,
    RequestClaim,
    answer_headers,
    request_accept,
    request_claim,
    request_precheck,
)
from federation.transport import MAX_HUB_BODY, RefusedBody, hub_json
from messaging.auth import AUTH, operator, principal, request_peer_address
from messaging.errors import Invalid, SwitchboardError, TooLarge

router = Router(tags=["federation"])
READ_CHUNK = 1024 * 1024
# The endpoints other hubs call, authenticated by a request signature (never a session token).
HUB_SIGNED_PATHS = (
    "/api/v1/federation/agents",
    "/api/v1/federation/messages",
    "/api/v1/federation/receipts",
    "/api/v1/relay/",
)
# On a request to one of them: its body's SHA-256 once read whole, None from the start of the read
# (a read refused past the cap leaves None). Absent: answered from the headers alone.
_BODY_SHA256 = "switchboard_hub_body_sha256"


def hub_request_precheck(headers: Mapping[str, str]) -> RequestClaim:
    """What can be refused before a hub request's body is read: its signature headers (key, time,
    nonce, destination: `request_precheck`), and a key this hub's policy refuses outright
    (`peers.peer_refusal`: revoked with mode `refuse`, or unvouched while trust on first use is off)."""
    claim = request_precheck(headers=headers)
    refusal = peer_refusal(claim.hub_key)
    if refusal is not None:
        raise refusal
    return claim


@dataclass(frozen=True)
class EarlyAnswer:
    """The answer to a hub request refused before its body is read, as the ASGI layer sends it."""

    status: int
    body: bytes
    headers: dict[str, str]


def hub_request_early_answer(
    *, method: str, path: str, full_path: str, headers: Mapping[str, str]
) -> EarlyAnswer | None:
    """For the ASGI layer, before it reads a request's body: the error answer, signed for the
    calling hub (`_answer_signature`), to a request to a hub-signed endpoint (`path`, below the
    mount point) that `hub_request_precheck` refuses, else None (the view checks again).
    `full_path` is the path with the query as the view would see it (`get_full_path`)."""
    from django.db import close_old_connections

    if not path.startswith(HUB_SIGNED_PATHS):
        return None
    try:
        hub_request_precheck(headers)
    except SwitchboardError as exc:
        body = json.dumps(exc.as_dict()).encode("utf-8")
        received = HubRequest(
            method=method, path=full_path, claim=request_claim(headers), body_sha256=BODY_NOT_READ
        )
        return EarlyAnswer(exc.status, body, _answer_signature(received, status=exc.status, body=body))
    finally:
        close_old_connections()  # outside a request's lifecycle: leave no connection behind
    return None


def hub_answer_sign(request: HttpRequest, response: HttpResponse) -> None:
    """Sign an answer to a request to a hub-signed endpoint for the hub that made it
    (`_answer_signature`), bound to the request as it reached this hub: its headers, method and
    path, and its body once read whole (an error refused before the body was read binds none).
    A read refused past the cap leaves the answer unsigned: the body the refusal rests on was
    never hashed, and bound to the headers alone it would answer the genuine request as well."""
    body_sha256 = getattr(request, _BODY_SHA256, BODY_NOT_READ)
    if body_sha256 is None or not request.path_info.startswith(HUB_SIGNED_PATHS):
        return
    received = HubRequest(
        method=request.method or "GET",
        path=request.get_full_path(),
        claim=request_claim(request.headers),
        body_sha256=body_sha256,
    )
    for name, value in _answer_signature(
        received, status=response.status_code, body=response.content
    ).items():
        response[name] = value


def _answer_signature(received: HubRequest, *, status: int, body: bytes) -> dict[str, str]:
    """This hub's answer signature headers for `received` (`answer_headers`); none for a request
    that names no calling key and nonce: no hub could take the answer as its own."""
    if not (received.claim.hub_key and received.claim.nonce):
        return {}
    return answer_headers(received, status=status, body=body)


def _body_read(request: HttpRequest) -> bytes:
    """The body, read in chunks with the cap enforced while reading (chunked bodies have no
    Content-Length to check first); its SHA-256 is kept on the request for the answer's
    signature (`hub_answer_sign`)."""
    setattr(request, _BODY_SHA256, None)
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > MAX_HUB_BODY:
        raise TooLarge(_TOO_LARGE, limit=MAX_HUB_BODY)
    parts: list[bytes] = []
    size = 0
    if request.method not in ("GET", "HEAD"):
        while chunk := request.read(READ_CHUNK):
            size += len(chunk)
            if size > MAX_HUB_BODY:
                raise TooLarge(_TOO_LARGE, limit=MAX_HUB_BODY)
            parts.append(chunk)
    raw = b"".join(parts)
    setattr(request, _BODY_SHA256, hashlib.sha256(raw).hexdigest())
    return raw


_TOO_LARGE = "A hub-to-hub request carries at most 200 MB of files (base64) and the text."


def _signed_raw(request: HttpRequest) -> tuple[str, bytes]:
    """The calling hub's key and the raw body. The headers are checked before a byte of the body
    is read; the signature over the body after; the nonce is then recorded as used."""
    claim = hub_request_precheck(request.headers)
    raw = _body_read(request)
    received = HubRequest(
        method=request.method or "GET",
        path=request.get_full_path(),
        claim=claim,
        body_sha256=getattr(request, _BODY_SHA256),
    )
    return request_accept(received), raw


def _signed(request: HttpRequest) -> tuple[str, Any]:
    """The calling hub's key and the parsed JSON body (see `_signed_raw`)."""
    hub_key, raw = _signed_raw(request)
    return hub_key, _json(raw)


def _json(raw: bytes) -> Any:
    try:
        return hub_json(raw) if raw else {}
    except RefusedBody as exc:
        raise Invalid(exc.reason, str(exc)) from exc
    except (ValueError, RecursionError) as exc:
        raise Invalid("bad_json", "The body is not JSON.") from exc


def _caller_name(request: HttpRequest) -> tuple[str, str]:
    return request.headers.get(NAME_HEADER, "")[:128], request.headers.get(URL_HEADER, "")[:512]


@router.get("/federation/hub", auth=None)
def hub(request: HttpRequest) -> dict[str, Any]:
    """This hub's name, public key and role (what another hub or an operator pins)."""
    from django.conf import settings

    me = hub_identity()
    return {
        "name": me.name,
        "public_key": me.public_key,
        "role": settings.SWITCHBOARD_ROLE,
        "url": settings.SWITCHBOARD_PUBLIC_URL,
    }


@router.get("/federation/agents", auth=None)
def agents(request: HttpRequest, to: str | None = None) -> dict[str, Any]:
    """Another hub asks "do you host `to`?" (or, without `to`, for the list of live agents)."""
    hub_key, _ = _signed(request)
    name, url = _caller_name(request)
    # Recorded as the tier this hub vouches for the key on; the URL it claims is never a route.
    standing = peer_seen(
        public_key=hub_key, name=name, url=url, tier=peer_vouched_tier(hub_key) or FederationTier.LAN
    )
    if to:
        return hosts_answer(target=to, vouched=standing.vouched)
    me = hub_identity()
    return {"hub_key": me.public_key, "hub_name": me.name, "agents": local_agents_public(standing)}


@router.post("/federation/messages", auth=None, response={200: dict, 201: dict})
def receive(request: HttpRequest) -> Status:
    """Another hub forwards a signed message for one of this hub's agents, sealed to this hub."""
    hub_key, raw = _signed_raw(request)
    body = _json(envelope_open(raw, content_type=request.content_type or ""))
    # The tier and trust come from how this hub vouches for `hub_key`; a `tier` in the body is ignored.
    result = inbound_accept(
        envelope=body.get("envelope"), caller_key=hub_key, caller_address=request_peer_address(request)
    )
    answer = {
        "message_id": result.message_id,
        "status": result.state,
        "duplicate": result.duplicate,
        "trust": result.trust,
    }
    if result.detail:
        answer["detail"] = result.detail
    return Status(200 if result.duplicate else 201, answer)


@router.post("/federation/receipts", auth=None)
def receipts(request: HttpRequest) -> dict[str, Any]:
    """Another hub reports how far messages forwarded to it got."""
    hub_key, body = _signed(request)
    items = body.get("receipts") if isinstance(body.get("receipts"), list) else []
    return {"applied": receipts_from_hub(hub_key=hub_key, receipts=items)}


class PinIn(Schema):
    public_key: str
    name: str = ""
    url: str = ""
    tier: str = "lan"


class RevokeIn(Schema):
    mode: str = "refuse"


@router.get("/federation/peers", auth=AUTH)
def peers(request: HttpRequest, after: int = 0, limit: int = PEERS_PAGE) -> dict[str, Any]:
    """Peer hubs this hub knows, a page at a time (`limit`, at most 1000, after the id `after`;
    `next` is the `after` of the next page, null on the last), and keys it refused to seal to
    lately for want of a pin (operators)."""
    operator(request)
    return {**peers_page(after=after, limit=limit), "unverified_keys": keys_refused_recently()}


@router.post("/federation/peers", auth=AUTH, response={200: dict, 201: dict})
def pin(request: HttpRequest, body: PinIn) -> Status:
    """Pin a peer hub's key (operators); with a URL it becomes a LAN peer."""
    from federation.services.peers import peer_summary

    peer = peer_pin(**body.dict(), actor=principal(request))
    return Status(201, peer_summary(peer))


@router.post("/federation/peers/{peer_id}/revoke", auth=AUTH)
def revoke(request: HttpRequest, peer_id: int, body: RevokeIn) -> dict[str, Any]:
    """Revoke a peer hub: its messages are refused, or held with escalate=required (operators)."""
    from federation.services.peers import peer_summary

    return peer_summary(peer_revoke(peer_id=peer_id, mode=body.mode, actor=principal(request)))


@router.post("/federation/peers/{peer_id}/restore", auth=AUTH)
def restore(request: HttpRequest, peer_id: int) -> dict[str, Any]:
    """Lift a peer hub's revocation (operators)."""
    from federation.services.peers import peer_summary

    return peer_summary(peer_restore(peer_id=peer_id, actor=principal(request)))


class IsolationIn(Schema):
    isolated: bool = True


@router.put("/federation/isolation/{session_id}", auth=AUTH)
def isolation(request: HttpRequest, session_id: uuid.UUID, body: IsolationIn) -> dict[str, Any]:
    """Hold every message this session sends off the machine (LAN, relay) for an operator (operators)."""
    from federation.services.peers import session_isolation_set

    return {
        "session_id": str(session_id),
        "isolated": session_isolation_set(
            session_id=str(session_id), isolated=body.isolated, actor=principal(request)
        ),
    }


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            }
        },
    }
}


@router.post("/files", auth=AUTH, response={200: dict, 201: dict}, openapi_extra=_UPLOAD_BODY)
def upload(request: HttpRequest) -> Status:
    """Upload a file (multipart, field `file`) to attach to a message: answers its SHA-256 (name
    it in `files` when sending). Streamed to disk; refused past the size limit or the session's
    quota of files no message uses yet."""
    session = principal(request).require_session()
    attachment = file_upload(
        session_id=session.id, meta=request.META, stream=request, encoding=request.encoding
    )
    return Status(201, {"sha256": attachment.sha256, "size": attachment.size})


# --- relay role -----------------------------------------------------------------------------------


@router.get("/relay/agents", auth=None)
def relay_agents_view(request: HttpRequest, to: str | None = None) -> dict[str, Any]:
    """Which hub holds the lease on `to` (or the list of leased names), with that hub's signed
    statement for the lease."""
    require_relay()
    _signed(request)
    if to:
        return relay_lookup(target=to)
    return {"agents": relay_agents()}


@router.post("/relay/leases", auth=None)
def lease(request: HttpRequest) -> dict[str, Any]:
    """Take or renew the lease on an agent name, with the calling hub's signed statement for it
    (`statement`; 400 `bad_lease_statement` without one that holds; 409 while another hub holds it)."""
    require_relay()
    hub_key, body = _signed(request)
    peer_seen(public_key=hub_key, name=_caller_name(request)[0], tier=FederationTier.RELAY)
    row = relay_lease_take(hub_key=hub_key, agent=str(body.get("agent", "")), statement=body.get("statement"))
    return {"agent": row.agent_name, "expires_at": row.expires_at.isoformat()}


@router.delete("/relay/leases/{agent}", auth=None)
def lease_drop(request: HttpRequest, agent: str) -> dict[str, Any]:
    require_relay()
    hub_key, _ = _signed(request)
    return {"released": relay_lease_release(hub_key=hub_key, agent=agent)}


@router.post("/relay/messages", auth=None, response={200: dict, 201: dict})
def relay_put(request: HttpRequest) -> Status:
    """Store a sealed message (or receipt batch) for the hub that will pull it."""
    require_relay()
    hub_key, body = _signed(request)
    peer_seen(public_key=hub_key, name=_caller_name(request)[0], tier=FederationTier.RELAY)
    row, created = relay_store(
        from_hub=hub_key,
        kind=str(body.get("kind", "message")),
        message_id=str(body.get("message_id", "")),
        dest_hub=str(body.get("dest_hub", "")),
        agent=str(body.get("agent", "")),
        sealed=str(body.get("sealed", "")),
        replace=bool(body.get("replace", False)),
    )
    return Status(201 if created else 200, {"id": str(row.id), "created": created})


@router.post("/relay/claims", auth=None)
def claims(request: HttpRequest) -> list[dict[str, Any]]:
    """Claim waiting messages for an agent this hub holds the lease on (or receipts for this hub)."""
    require_relay()
    hub_key, body = _signed(request)
    return relay_claim(
        hub_key=hub_key, agent=str(body.get("agent", "")), kind=str(body.get("kind", "message"))
    )


@router.post("/relay/pull", auth=None)
def pull(request: HttpRequest) -> dict[str, Any]:
    """One pull cycle: renew leases on `agents` (each with its signed statement in `statements`,
    by name), claim their messages and this hub's receipts."""
    require_relay()
    hub_key, body = _signed(request)
    peer_seen(public_key=hub_key, name=_caller_name(request)[0], tier=FederationTier.RELAY)
    agents = body.get("agents") if isinstance(body.get("agents"), list) else []
    statements = body.get("statements") if isinstance(body.get("statements"), dict) else {}
    return relay_pull(hub_key=hub_key, agents=agents, statements=statements)


@router.post("/relay/claims/finish", auth=None)
def claims_finish(request: HttpRequest) -> dict[str, Any]:
    """Finish many claims: `done` (delivered) and `release` (back for another try)."""
    require_relay()
    hub_key, body = _signed(request)
    done = body.get("done") if isinstance(body.get("done"), list) else []
    release = body.get("release") if isinstance(body.get("release"), list) else []
    return {"changed": relay_claims_finish(hub_key=hub_key, done=done, release=release)}


@router.post("/relay/claims/{claim_id}/{outcome}", auth=None)
def claim_finish(request: HttpRequest, claim_id: str, outcome: str) -> dict[str, Any]:
    """`done` (delivered: the relay forgets it) or `release` (delivery failed: back for retry)."""
    require_relay()
    hub_key, _ = _signed(request)
    return {"ok": relay_claim_finish(hub_key=hub_key, claim_id=claim_id, outcome=outcome)}
