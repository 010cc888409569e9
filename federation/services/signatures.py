"""Signatures between hubs: over a forwarded message's facts, and over each hub-to-hub request.

A message signature (version 3) covers every field of the envelope that changes what a recipient
sees or where the message goes: the message id, the sending hub (key, name, URL), the sender (id,
name, ref), the recipient as addressed, the destination hub's public key (`dest`: the hub the origin
sealed it to), the text's SHA-256, summary, priority, kind, creation time, and each file's SHA-256
and name. With `dest` signed, a hub that received a message cannot pass it off to a third hub as
sent there (`envelope_verify` checks it against the key the receiver expects). Only `hops` is left
out, because a hub that forwards a message onward raises it; it is covered instead by the carrying
hub's request signature (over the whole body) and bounded by SWITCHBOARD_MAX_HOPS, and a message id
is accepted once per origin hub, so a carrying hub that lowers it gains no second delivery. An
envelope of an older version (no `dest`) never verifies.

A receipt batch signature (version 2) covers the reporting hub's key, the key of the hub the
batch is for (`dest`: the origin of every message it reports on) and the receipts (each message
id, its state and any reason). With `dest` signed, a hub that was sent a batch, or a relay that
could open one, cannot pass it to another hub, which checks it names its own key. A batch of the
older format (no version, no `dest`) never verifies.

A request signature covers method, path (with query), time, a random nonce, the destination hub's
public key, the caller's name and URL headers and the body's SHA-256. The receiver checks the
headers before it reads the body (`request_precheck`): well-formed key, fresh time, addressed to
this hub, nonce never seen; after the signature checks out the nonce is recorded (`nonce_record`),
so the same request inside the time window is refused. Nonces live in the database (one table
shared by every web process of a hub) until their request could no longer be fresh.

An answer signature (`switchboard-answer-1`) is made by the answering hub over its answer's status
and body SHA-256, bound to the request as it reached that hub: the caller's key and request
signature, method, path, time, nonce, destination, name and URL headers, and the request body's
SHA-256, or BODY_NOT_READ for an error answered from the headers alone (before the body is read).
The caller takes an answer only when it verifies with the key it signed the request for and binds
that very request (`answer_problem`): a forged, altered or replayed answer, or one that answers a
changed copy of the request, counts as no answer. An error answered before the body was read
depends on nothing but the headers, which it binds; a 2xx always binds the body.

A lease statement (`switchboard-lease-1`) is a hub's own word that it holds the relay lease on an
agent's name: signed by the leasing hub over the name (normalized, as the relay keys it), its own
key, the key of the relay it is for and a time window (issued at, valid until: at most the lease
period plus LEASE_CLOCK_SLACK_SECONDS). The relay keeps it with the lease and hands it to senders
with its answer; a sender seals to the key the relay names only when that key signed such a
statement for the name it asked about, for its relay, still fresh (`lease_statement_problem`). So
the relay's word alone never moves a name to another hub this hub trusts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from nacl.encoding import Base64Encoder
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey

from federation.errors import BadRequestSignature, ReplayedRequest
from federation.services.identity import hub_identity, verify_key_from
from messaging.names import normalize_name

MESSAGE_SIGNATURE_VERSION = 3
RECEIPT_SIGNATURE_VERSION = 2
REQUEST_SIGNATURE_VERSION = "switchboard-request-2"
ANSWER_SIGNATURE_VERSION = "switchboard-answer-1"
LEASE_STATEMENT_VERSION = "switchboard-lease-1"
# A lease statement's fields: the version, the signed facts (`lease_statement_digest_input`), the
# signature.
LEASE_STATEMENT_FIELDS = ("v", "agent", "hub", "relay", "issued_at", "valid_until", "signature")
# How far apart the clocks of a leasing hub, its relay and a sender may be: a lease statement is
# good for the lease period plus this, and one dated up to this far ahead is still taken.
LEASE_CLOCK_SLACK_SECONDS = 30
REQUEST_SKEW_SECONDS = 300
HUB_HEADER = "X-Switchboard-Hub"
TIME_HEADER = "X-Switchboard-Time"
NONCE_HEADER = "X-Switchboard-Nonce"
DEST_HEADER = "X-Switchboard-Dest"
SIGNATURE_HEADER = "X-Switchboard-Signature"
NAME_HEADER = "X-Switchboard-Hub-Name"
URL_HEADER = "X-Switchboard-Hub-Url"
ANSWER_VERSION_HEADER = "X-Switchboard-Answer-Version"
ANSWER_HUB_HEADER = "X-Switchboard-Answer-Hub"
ANSWER_NONCE_HEADER = "X-Switchboard-Answer-Nonce"
ANSWER_SIGNATURE_HEADER = "X-Switchboard-Answer-Signature"
# In place of a request body's SHA-256: the hub answered from the request's headers alone.
BODY_NOT_READ = "-"
_NONCE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def message_digest_input(
    *,
    message_id: str,
    origin: Mapping[str, Any],
    to: str,
    dest: str,
    text_sha256: str,
    summary: Any,
    priority: Any,
    kind: Any,
    created_at: Any,
    files: Sequence[tuple[Any, Any]],
) -> bytes:
    """The exact bytes a message signature covers (canonical JSON, version 3)."""
    return _canonical(
        {
            "v": MESSAGE_SIGNATURE_VERSION,
            "id": message_id,
            "from": {k: origin.get(k) for k in ("hub", "hub_name", "url", "id", "name", "ref")},
            "to": to,
            "dest": dest,
            "sha256": text_sha256,
            "summary": summary,
            "priority": priority,
            "kind": kind,
            "created_at": created_at,
            "files": [list(f) for f in files],
        }
    )


def sign_bytes(data: bytes, *, key: SigningKey | None = None) -> str:
    """This hub's (or `key`'s) detached Ed25519 signature of `data`, base64."""
    key = key or hub_identity().signing_key
    return base64.b64encode(key.sign(data).signature).decode("ascii")


def verify_bytes(*, public_key: str, data: bytes, signature: str) -> bool:
    """True when `signature` is `public_key`'s signature of `data`; False for anything else."""
    try:
        key = verify_key_from(public_key)
        key.verify(data, base64.b64decode(signature, validate=True))
        return True
    except (BadSignatureError, ValueError, TypeError):
        return False


def envelope_signed_fields(envelope: Mapping[str, Any]) -> bytes:
    sender = envelope.get("from")
    files = envelope.get("files")
    return message_digest_input(
        message_id=str(envelope.get("id", "")),
        origin=sender if isinstance(sender, Mapping) else {},
        to=str(envelope.get("to", "")),
        dest=str(envelope.get("dest", "")),
        text_sha256=hashlib.sha256(str(envelope.get("text", "")).encode("utf-8")).hexdigest(),
        summary=envelope.get("summary"),
        priority=envelope.get("priority"),
        kind=envelope.get("kind"),
        created_at=envelope.get("created_at"),
        files=[
            (f.get("sha256"), f.get("name")) if isinstance(f, Mapping) else (None, None)
            for f in (files if isinstance(files, list) else [])
        ],
    )


def envelope_sign(envelope: dict[str, Any], *, key: SigningKey | None = None) -> dict[str, Any]:
    """Add this hub's signature to a message envelope (its `from.hub` must be this hub, its `dest`
    the key of the hub it is sealed to)."""
    envelope["v"] = MESSAGE_SIGNATURE_VERSION
    envelope["signature"] = sign_bytes(envelope_signed_fields(envelope), key=key)
    return envelope


def envelope_verify(envelope: Mapping[str, Any], *, dest_key: str) -> bool:
    """True when the envelope carries a valid version-3 signature by the hub it names as sender,
    made for the hub holding `dest_key` (the receiver itself, or the hub that carried it onward).
    An envelope of an older version does not verify: its signature leaves fields out (v2: the
    destination), so it could be replayed to any hub."""
    hub_key = str((envelope.get("from") or {}).get("hub", ""))
    signature = envelope.get("signature")
    if not hub_key or not isinstance(signature, str) or envelope.get("v") != MESSAGE_SIGNATURE_VERSION:
        return False
    if not dest_key or envelope.get("dest") != dest_key:
        return False
    return verify_bytes(public_key=hub_key, data=envelope_signed_fields(envelope), signature=signature)


# --- receipt batches ------------------------------------------------------------------------------


def receipt_batch_digest_input(*, hub: str, dest: str, receipts: Any) -> bytes:
    """The exact bytes a receipt batch signature covers (canonical JSON, version 2)."""
    return _canonical(
        {"v": RECEIPT_SIGNATURE_VERSION, "of": "receipts", "hub": hub, "dest": dest, "receipts": receipts}
    )


def receipt_batch_sign(
    *, receipts: list[dict[str, Any]], dest_key: str, key: SigningKey | None = None
) -> dict[str, Any]:
    """A receipt batch signed by this hub (or `key`) for the hub holding `dest_key`, the origin of
    the messages it reports on: what travels (sealed to that hub) through the relay."""
    signer = key or hub_identity().signing_key
    hub = signer.verify_key.encode(Base64Encoder).decode("ascii")
    batch: dict[str, Any] = {
        "v": RECEIPT_SIGNATURE_VERSION,
        "hub": hub,
        "dest": dest_key,
        "receipts": receipts,
    }
    batch["signature"] = sign_bytes(
        receipt_batch_digest_input(hub=hub, dest=dest_key, receipts=receipts), key=signer
    )
    return batch


def receipt_batch_problem(batch: Mapping[str, Any], *, dest_key: str) -> str | None:
    """Why a receipt batch is not to be believed by the hub holding `dest_key`, or None when it
    carries a valid version-2 signature by the hub it names (`hub`), made for `dest_key`."""
    if batch.get("v") != RECEIPT_SIGNATURE_VERSION:
        return "an older format that signs no destination (every hub must send version 2)"
    if not dest_key or batch.get("dest") != dest_key:
        return "signed for another hub"
    hub, signature = batch.get("hub"), batch.get("signature")
    if not isinstance(hub, str) or not isinstance(signature, str):
        return "unsigned"
    digest = receipt_batch_digest_input(hub=hub, dest=dest_key, receipts=batch.get("receipts"))
    if not verify_bytes(public_key=hub, data=digest, signature=signature):
        return "bad signature"
    return None


# --- relay lease statements -----------------------------------------------------------------------


def lease_statement_digest_input(
    *, agent: Any, hub: Any, relay: Any, issued_at: Any, valid_until: Any
) -> bytes:
    """The exact bytes a lease statement's signature covers (canonical JSON)."""
    return _canonical(
        {
            "v": LEASE_STATEMENT_VERSION,
            "of": "relay-lease",
            "agent": agent,
            "hub": hub,
            "relay": relay,
            "issued_at": issued_at,
            "valid_until": valid_until,
        }
    )


def lease_statement_sign(
    *, agent: str, relay_key: str, now: float | None = None, key: SigningKey | None = None
) -> dict[str, Any]:
    """This hub's (or `key`'s) statement that it holds the lease on `agent` at the relay holding
    `relay_key`, good from `now` for SWITCHBOARD_RELAY_LEASE_SECONDS plus the clock slack: what
    the relay keeps with the lease and shows senders, who believe the relay's word on the name
    only as far as this statement goes (`lease_statement_problem`)."""
    signer = key or hub_identity().signing_key
    hub = signer.verify_key.encode(Base64Encoder).decode("ascii")
    issued_at = int(time.time() if now is None else now)
    facts = {
        "agent": normalize_name(agent),
        "hub": hub,
        "relay": relay_key,
        "issued_at": issued_at,
        "valid_until": issued_at + lease_statement_longest(),
    }
    return {
        "v": LEASE_STATEMENT_VERSION,
        **facts,
        "signature": sign_bytes(lease_statement_digest_input(**facts), key=signer),
    }


def lease_statement_kept(statement: Mapping[str, Any]) -> dict[str, Any]:
    """Of a statement that holds (`lease_statement_problem`), what its signature covers and
    nothing else: what a relay keeps with the lease and shows whoever asks. Any other field is the
    leasing key's padding, which would cost the relay, and every answer naming the lease, its size."""
    return {field: statement[field] for field in LEASE_STATEMENT_FIELDS}


def lease_statement_problem(
    statement: Any,
    *,
    hub_key: str,
    agent: str,
    relay_key: str,
    now: float | None = None,
    longest: int | None = None,
) -> str | None:
    """Why `statement` does not show that the hub holding `hub_key` leased `agent` (normalized
    here) at the relay holding `relay_key`, good at `now`; None when it does. `longest`: the most
    seconds between its issue and its end that is believed (a sender's lease period plus the
    slack), so that a relay cannot keep handing out a statement long after its hub let the name go;
    None to leave the window's length unchecked (the relay itself, whose lease period the hubs
    need not share: its lease ends with the statement anyway)."""
    if not isinstance(statement, Mapping):
        return "no lease statement (a hub, or a relay, of an older version has none)"
    if statement.get("v") != LEASE_STATEMENT_VERSION:
        return f"a lease statement in a format this hub does not know ({str(statement.get('v'))[:40]!r})"
    if statement.get("hub") != hub_key:
        return "a lease statement of another hub key than the one named"
    if statement.get("agent") != normalize_name(agent):
        return "a lease statement for another name"
    if statement.get("relay") != relay_key:
        return "a lease statement made for another relay"
    issued_at, valid_until = statement.get("issued_at"), statement.get("valid_until")
    if not all(type(t) is int for t in (issued_at, valid_until)):
        return "a lease statement without its time window"
    clock = time.time() if now is None else now
    if valid_until < issued_at:
        return "a lease statement that ends before it begins"
    if issued_at > clock + LEASE_CLOCK_SLACK_SECONDS:
        return "a lease statement dated in the future"
    if valid_until <= clock:
        return "an expired lease statement"
    if longest is not None and valid_until - issued_at > longest:
        return f"a lease statement good for {valid_until - issued_at} s, longer than a lease ({longest} s)"
    signature = statement.get("signature")
    digest = lease_statement_digest_input(
        agent=statement["agent"], hub=hub_key, relay=relay_key, issued_at=issued_at, valid_until=valid_until
    )
    if not isinstance(signature, str) or not verify_bytes(
        public_key=hub_key, data=digest, signature=signature
    ):
        return "a lease statement whose signature does not verify with the key it names"
    return None


def lease_statement_longest() -> int:
    """The longest window of a lease statement this hub believes: its lease period plus the slack."""
    return settings.SWITCHBOARD_RELAY_LEASE_SECONDS + LEASE_CLOCK_SLACK_SECONDS


def lease_statement_seconds_left(statement: Mapping[str, Any], *, now: float | None = None) -> float:
    """How long a statement that `lease_statement_problem` found good stays good: what a lookup
    resting on it may be remembered for."""
    return float(statement["valid_until"]) - (time.time() if now is None else now)


# --- requests -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestClaim:
    """What a request's headers say about who sent it; trusted only once `request_verify` passed."""

    hub_key: str
    stamp: str
    nonce: str
    dest: str
    signature: str
    name: str
    url: str

    def headers(self) -> dict[str, str]:
        """The signature headers that carry this claim."""
        headers = {
            HUB_HEADER: self.hub_key,
            NAME_HEADER: self.name,
            TIME_HEADER: self.stamp,
            NONCE_HEADER: self.nonce,
            DEST_HEADER: self.dest,
            SIGNATURE_HEADER: self.signature,
        }
        if self.url:
            headers[URL_HEADER] = self.url
        return headers


@dataclass(frozen=True)
class HubRequest:
    """A hub-to-hub request as one side holds it: as this hub signed it (`request_sign`), or as it
    reached this hub (its claim unverified until `request_accept`). `body_sha256` is its body's
    SHA-256, or BODY_NOT_READ for a request answered from its headers alone."""

    method: str
    path: str  # with the query
    claim: RequestClaim
    body_sha256: str


def _request_input(request: HubRequest) -> bytes:
    claim = request.claim
    return "\n".join(
        [
            REQUEST_SIGNATURE_VERSION,
            request.method.upper(),
            request.path,
            claim.stamp,
            claim.nonce,
            claim.dest,
            claim.name,
            claim.url,
            request.body_sha256,
        ]
    ).encode("utf-8")


def request_claim(headers: Mapping[str, str]) -> RequestClaim:
    """What a request's signature headers claim, as they came (nothing checked: `request_precheck`)."""
    return RequestClaim(
        hub_key=headers.get(HUB_HEADER, ""),
        stamp=headers.get(TIME_HEADER, ""),
        nonce=headers.get(NONCE_HEADER, ""),
        dest=headers.get(DEST_HEADER, ""),
        signature=headers.get(SIGNATURE_HEADER, ""),
        name=headers.get(NAME_HEADER, "")[:128],
        url=headers.get(URL_HEADER, "")[:512],
    )


def request_sign(
    *,
    method: str,
    path: str,
    body: bytes,
    dest_key: str,
    public_url: str = "",
    key: SigningKey | None = None,
    name: str = "",
) -> HubRequest:
    """A request this hub (or the holder of `key`) makes, once, for the hub holding `dest_key`
    (path includes the query), signed: its headers are `.claim.headers()`, and its answer is
    checked against it (`answer_problem`)."""
    key = key or hub_identity().signing_key
    unsigned = RequestClaim(
        hub_key=key.verify_key.encode(Base64Encoder).decode("ascii"),
        stamp=str(int(time.time())),
        nonce=secrets.token_urlsafe(18),
        dest=dest_key,
        signature="",
        name=(name or hub_identity().name)[:128],
        url=public_url[:512],
    )
    request = HubRequest(
        method=method.upper(), path=path, claim=unsigned, body_sha256=hashlib.sha256(body).hexdigest()
    )
    signed = replace(unsigned, signature=sign_bytes(_request_input(request), key=key))
    return replace(request, claim=signed)


def request_precheck(*, headers: Mapping[str, str], now: float | None = None) -> RequestClaim:
    """Everything about a hub request that can be checked before its body is read: a well-formed
    key, a fresh time, a well-formed nonce not seen before, and this hub as its destination.
    Raises BadRequestSignature or ReplayedRequest; reads no body and writes nothing."""
    claim = request_claim(headers)
    if not (claim.hub_key and claim.stamp and claim.signature and claim.nonce and claim.dest):
        raise BadRequestSignature(
            "Hub calls carry the calling hub's key, a time, a nonce, the destination hub's key and "
            "a signature (X-Switchboard-* headers)."
        )
    try:
        verify_key_from(claim.hub_key)
    except ValueError:
        raise BadRequestSignature("X-Switchboard-Hub is not a base64 Ed25519 public key.") from None
    if not claim.stamp.isdigit() or abs((now or time.time()) - int(claim.stamp)) > REQUEST_SKEW_SECONDS:
        raise BadRequestSignature(
            f"The request's time is more than {REQUEST_SKEW_SECONDS} s from this hub's clock; sign it afresh."
        )
    if not _NONCE.match(claim.nonce):
        raise BadRequestSignature("X-Switchboard-Nonce is 16 to 64 URL-safe characters.")
    if claim.dest != hub_identity().public_key:
        raise BadRequestSignature(
            "This request was signed for another hub (X-Switchboard-Dest is not this hub's key)."
        )
    if nonce_seen(hub_key=claim.hub_key, nonce=claim.nonce):
        raise ReplayedRequest("This request was already received once; a hub signs each request afresh.")
    return claim


def request_verify(*, method: str, path: str, body: bytes, claim: RequestClaim) -> bool:
    """True when the claim's signature covers this method, path and body."""
    return _request_verified(
        HubRequest(method=method, path=path, claim=claim, body_sha256=hashlib.sha256(body).hexdigest())
    )


def _request_verified(request: HubRequest) -> bool:
    claim = request.claim
    return verify_bytes(public_key=claim.hub_key, data=_request_input(request), signature=claim.signature)


def request_accept(received: HubRequest) -> str:
    """The calling hub's key, once the signature of the request as received (its body read whole)
    checks out and the nonce is recorded as used (BadRequestSignature or ReplayedRequest otherwise)."""
    if received.body_sha256 == BODY_NOT_READ or not _request_verified(received):
        raise BadRequestSignature("Hub calls carry a fresh request signature by the calling hub's key.")
    claim = received.claim
    nonce_record(hub_key=claim.hub_key, nonce=claim.nonce, stamp=int(claim.stamp))
    return claim.hub_key


def nonce_seen(*, hub_key: str, nonce: str) -> bool:
    from federation.models import RequestNonce

    return RequestNonce.objects.filter(hub_key=hub_key, nonce=nonce).exists()


def nonce_record(*, hub_key: str, nonce: str, stamp: int) -> None:
    """Record a request's nonce as used until its time can no longer be fresh; ReplayedRequest when
    another process recorded it first (two copies of one request raced)."""
    from federation.models import RequestNonce

    keep_until = datetime.fromtimestamp(stamp + REQUEST_SKEW_SECONDS + 1, tz=UTC)
    try:
        with transaction.atomic():
            RequestNonce.objects.create(hub_key=hub_key, nonce=nonce, expires_at=keep_until)
    except IntegrityError:
        raise ReplayedRequest(
            "This request was already received once; a hub signs each request afresh."
        ) from None


def nonces_prune(*, now: datetime | None = None) -> int:
    """Forget nonces whose requests are too old to be accepted anyway. Returns how many went."""
    from django.utils import timezone

    from federation.models import RequestNonce

    deleted, _ = RequestNonce.objects.filter(expires_at__lt=now or timezone.now()).delete()
    return deleted


# --- answers --------------------------------------------------------------------------------------


def _answer_input(request: HubRequest, *, hub_key: str, status: int, body: bytes) -> bytes:
    return b"\n".join(
        [
            ANSWER_SIGNATURE_VERSION.encode("ascii"),
            hub_key.encode("utf-8"),
            str(status).encode("ascii"),
            hashlib.sha256(body).hexdigest().encode("ascii"),
            request.claim.hub_key.encode("utf-8"),
            request.claim.signature.encode("utf-8"),
            _request_input(request),
        ]
    )


def answer_headers(
    request: HubRequest, *, status: int, body: bytes, key: SigningKey | None = None
) -> dict[str, str]:
    """Headers that prove this hub (or the holder of `key`) gave this answer (status and body) to
    `request`, as the request reached it: for the calling hub to check (`answer_problem`)."""
    key = key or hub_identity().signing_key
    hub_key = key.verify_key.encode(Base64Encoder).decode("ascii")
    signed = _answer_input(request, hub_key=hub_key, status=status, body=body)
    return {
        ANSWER_VERSION_HEADER: ANSWER_SIGNATURE_VERSION,
        ANSWER_HUB_HEADER: hub_key,
        ANSWER_NONCE_HEADER: request.claim.nonce,
        ANSWER_SIGNATURE_HEADER: sign_bytes(signed, key=key),
    }


def answer_problem(
    request: HubRequest, *, status: int, body: bytes, headers: Mapping[str, str], dest_key: str
) -> str | None:
    """Why an answer (status, body, headers) is not to be taken as the answer of the hub holding
    `dest_key` to `request` as this hub signed it, or None when it is. An error answer (4xx, 5xx)
    may be bound to the request without its body (BODY_NOT_READ): the hub refused it from its
    headers alone, so nothing else went into it; a 2xx never is, since it takes the body verified."""
    signature = headers.get(ANSWER_SIGNATURE_HEADER, "")
    version = headers.get(ANSWER_VERSION_HEADER, "")
    hub_key = headers.get(ANSWER_HUB_HEADER, "")
    if not signature:
        return "unsigned"
    if version != ANSWER_SIGNATURE_VERSION:
        return f"signed in a format this hub does not know ({version[:40]!r})"
    if hub_key != dest_key:
        return f"signed by another hub key ({hub_key[:16]}…), not the one this hub holds for it"
    if headers.get(ANSWER_NONCE_HEADER, "") != request.claim.nonce:
        return "the answer to another request"
    bound = [request, replace(request, body_sha256=BODY_NOT_READ)] if status >= 400 else [request]
    for candidate in bound:
        signed = _answer_input(candidate, hub_key=dest_key, status=status, body=body)
        if verify_bytes(public_key=dest_key, data=signed, signature=signature):
            return None
    return (
        "a signature that does not verify (its status or body was changed on the way, or it "
        "answers an altered copy of this request)"
    )
