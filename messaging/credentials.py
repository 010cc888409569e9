"""Tokens and keys: made random, stored hashed, compared in constant time, never logged."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings

from messaging.home import read_or_create_secret

SESSION_PREFIX = "sbs_"
OPERATOR_PREFIX = "sbo_"
TOKEN_BYTES = 32  # 256 bits


def new_token(prefix: str) -> tuple[str, str]:
    """A fresh bearer token and the hash to store in its place."""
    token = prefix + secrets.token_urlsafe(TOKEN_BYTES)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    """SHA-256 of a token. Tokens carry 256 random bits, so a fast hash is enough to keep them
    useless if the database leaks."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def enrollment_key() -> str:
    """The key that lets a caller register sessions: SWITCHBOARD_ENROLL_KEY, else the one generated
    once into $SWITCHBOARD_HOME/enroll.key (0600)."""
    return settings.SWITCHBOARD_ENROLL_KEY or read_or_create_secret("enroll.key")


def is_enrollment_key(candidate: str) -> bool:
    return hmac.compare_digest(candidate.encode("utf-8"), enrollment_key().encode("utf-8"))
