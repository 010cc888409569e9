"""This hub's identity: an Ed25519 key pair kept in `$SWITCHBOARD_HOME/hub.key` (0600), and a name.

The public key (base64) is the hub's id among hubs. The same key, converted to Curve25519, is what
other hubs seal relay payloads to, so one secret file covers signing and decryption.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from nacl.encoding import Base64Encoder
from nacl.signing import SigningKey, VerifyKey

from switchboard_agent.home import write_private

KEY_FILE = "hub.key"


@dataclass(frozen=True)
class HubIdentity:
    name: str
    signing_key: SigningKey

    @property
    def public_key(self) -> str:
        return self.signing_key.verify_key.encode(Base64Encoder).decode("ascii")

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self.public_key)


def key_fingerprint(public_key: str) -> str:
    """A short, filename-safe id for a hub key (first 16 hex digits of its SHA-256)."""
    return hashlib.sha256(public_key.encode("ascii")).hexdigest()[:16]


def _load_or_create(path: Path) -> SigningKey:
    try:
        raw = path.read_text(encoding="ascii").strip()
        if raw:
            return SigningKey(base64.b64decode(raw))
    except FileNotFoundError:
        pass
    key = SigningKey.generate()
    seed = base64.b64encode(bytes(key)).decode("ascii")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its key
        return SigningKey(base64.b64decode(path.read_text(encoding="ascii").strip()))
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(seed + "\n")
    return key


@lru_cache(maxsize=8)
def _identity_for(home: str, name: str) -> HubIdentity:
    key = _load_or_create(Path(home) / KEY_FILE)
    return HubIdentity(
        name=name or f"{socket.gethostname()}-{key_fingerprint(_pub(key))[:6]}", signing_key=key
    )


def _pub(key: SigningKey) -> str:
    return key.verify_key.encode(Base64Encoder).decode("ascii")


def hub_identity() -> HubIdentity:
    """This hub's identity (created on first use)."""
    return _identity_for(str(settings.SWITCHBOARD_HOME), settings.SWITCHBOARD_HUB_NAME)


def verify_key_from(public_key: str) -> VerifyKey:
    """The verify key for a base64 Ed25519 public key (ValueError when it is not one)."""
    try:
        raw = base64.b64decode(public_key, validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError("not base64") from exc
    if len(raw) != 32:
        raise ValueError("an Ed25519 public key has 32 bytes")
    return VerifyKey(raw)


def hub_key_write_public(path: Path) -> None:
    """Write this hub's public key to `path` (for an operator to pin elsewhere)."""
    write_private(path, hub_identity().public_key + "\n")
