"""Signatures between hubs: over a forwarded message's facts, and over each hub-to-hub request.

A message signature covers the message id, the sending hub, the sender (id, name), the recipient
as addressed, the SHA-256 of the text and the SHA-256 of every file, so a hub on the way can't
change any of them without the check failing. A request signature covers method, path, time and
the body's SHA-256, and proves which hub key is calling.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from nacl.encoding import Base64Encoder
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey

from federation.services.identity import hub_identity, verify_key_from

REQUEST_SKEW_SECONDS = 300
HUB_HEADER = "X-Switchboard-Hub"
TIME_HEADER = "X-Switchboard-Time"
SIGNATURE_HEADER = "X-Switchboard-Signature"
NAME_HEADER = "X-Switchboard-Hub-Name"
URL_HEADER = "X-Switchboard-Hub-Url"


def message_digest_input(
    *,
    message_id: str,
    hub_key: str,
    sender_id: str,
    sender_name: str,
    to: str,
    text_sha256: str,
    file_sha256s: Sequence[str],
) -> bytes:
    """The exact bytes a message signature covers (canonical JSON)."""
    return json.dumps(
        {
            "v": 1,
            "id": message_id,
            "hub": hub_key,
            "sender": [sender_id, sender_name],
            "to": to,
            "sha256": text_sha256,
            "files": list(file_sha256s),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode("ascii")


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
    sender = envelope.get("from") or {}
    return message_digest_input(
        message_id=str(envelope.get("id", "")),
        hub_key=str(sender.get("hub", "")),
        sender_id=str(sender.get("id", "")),
        sender_name=str(sender.get("name", "")),
        to=str(envelope.get("to", "")),
        text_sha256=hashlib.sha256(str(envelope.get("text", "")).encode("utf-8")).hexdigest(),
        file_sha256s=[str(f.get("sha256", "")) for f in envelope.get("files") or []],
    )


def envelope_sign(envelope: dict[str, Any], *, key: SigningKey | None = None) -> dict[str, Any]:
    """Add this hub's signature to a message envelope (its `from.hub` must be this hub)."""
    envelope["signature"] = sign_bytes(envelope_signed_fields(envelope), key=key)
    return envelope


def envelope_verify(envelope: Mapping[str, Any]) -> bool:
    """True when the envelope carries a valid signature by the hub it names as sender."""
    hub_key = str((envelope.get("from") or {}).get("hub", ""))
    signature = envelope.get("signature")
    if not hub_key or not isinstance(signature, str):
        return False
    return verify_bytes(public_key=hub_key, data=envelope_signed_fields(envelope), signature=signature)


def _request_input(method: str, path: str, stamp: str, body: bytes) -> bytes:
    return "\n".join([method.upper(), path, stamp, hashlib.sha256(body).hexdigest()]).encode("utf-8")


def request_headers(
    *,
    method: str,
    path: str,
    body: bytes,
    public_url: str = "",
    key: SigningKey | None = None,
    name: str = "",
) -> dict[str, str]:
    """Headers that prove this hub (or the holder of `key`) made the request (path includes the query)."""
    me = hub_identity()
    key = key or me.signing_key
    stamp = str(int(time.time()))
    headers = {
        HUB_HEADER: key.verify_key.encode(Base64Encoder).decode("ascii"),
        NAME_HEADER: name or me.name,
        TIME_HEADER: stamp,
        SIGNATURE_HEADER: sign_bytes(_request_input(method, path, stamp, body), key=key),
    }
    if public_url:
        headers[URL_HEADER] = public_url
    return headers


def request_verify(
    *, method: str, path: str, body: bytes, headers: Mapping[str, str], now: float | None = None
) -> str | None:
    """The calling hub's public key when the request's signature checks out and is fresh, else None."""
    hub_key = headers.get(HUB_HEADER, "")
    stamp = headers.get(TIME_HEADER, "")
    signature = headers.get(SIGNATURE_HEADER, "")
    if not (hub_key and stamp and signature) or not stamp.isdigit():
        return None
    if abs((now or time.time()) - int(stamp)) > REQUEST_SKEW_SECONDS:
        return None
    if not verify_bytes(
        public_key=hub_key, data=_request_input(method, path, stamp, body), signature=signature
    ):
        return None
    return hub_key
