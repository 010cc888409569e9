"""Operator tokens: minting one (`switchboard manage operator_token NAME`), revoking and restoring
it (the Django admin's actions). Each change is audited; the token itself is never stored."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from messaging.credentials import OPERATOR_PREFIX, new_token
from messaging.models import OperatorToken
from messaging.principals import Principal
from messaging.services.audit import audit_event


def operator_token_create(*, name: str) -> str:
    """Mint an operator token named `name` and return it (shown once; only its hash is kept)."""
    if not name or len(name) > 100:
        raise ValueError("An operator token needs a name of 1 to 100 characters.")
    token, token_hash = new_token(OPERATOR_PREFIX)
    with transaction.atomic():
        OperatorToken.objects.create(name=name, token_hash=token_hash)
        audit_event("operator_token.created", actor="hub", target=name)
    return token


def operator_token_revoke(*, token_id: Any, actor: Principal) -> bool:
    """An operator revokes a token: its next request is answered 401. False when it already was."""
    return _token_set_revoked(token_id=token_id, actor=actor, revoked=True)


def operator_token_restore(*, token_id: Any, actor: Principal) -> bool:
    """An operator restores a revoked token. False when it was not revoked."""
    return _token_set_revoked(token_id=token_id, actor=actor, revoked=False)


def _token_set_revoked(*, token_id: Any, actor: Principal, revoked: bool) -> bool:
    actor.require_operator()
    with transaction.atomic():
        token = OperatorToken.objects.filter(pk=token_id).first()
        # Conditional on the current value: a change that happened is audited once, and a
        # repeated or concurrent one writes nothing.
        if token is None or not OperatorToken.objects.filter(pk=token.pk, revoked=not revoked).update(
            revoked=revoked
        ):
            return False
        audit_event(
            "operator_token.revoked" if revoked else "operator_token.restored",
            actor=actor.actor,
            target=token.name,
        )
    return True
