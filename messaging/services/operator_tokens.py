"""Operator tokens: minting one (`switchboard manage operator_token NAME`), revoking and restoring
it (the Django admin's actions, and `operator_token NAME --revoke` / `--restore`). Each change is
audited; the token itself is never stored."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from messaging.credentials import OPERATOR_PREFIX, new_token
from messaging.errors import Conflict, NotFound
from messaging.models import OperatorToken
from messaging.principals import Principal
from messaging.services.audit import audit_event


def operator_token_create(*, name: str, actor: Principal) -> str:
    """`actor` mints an operator token named `name` and gets it back (shown once; only its hash
    is kept)."""
    if not name or len(name) > 100:
        raise ValueError("An operator token needs a name of 1 to 100 characters.")
    token, token_hash = new_token(OPERATOR_PREFIX)
    with transaction.atomic():
        OperatorToken.objects.create(name=name, token_hash=token_hash)
        audit_event("operator_token.created", actor=actor.actor, target=name)
    return token


def operator_token_revoke(*, token_id: Any, actor: Principal) -> bool:
    """An operator revokes a token: its next request is answered 401. False when it already was."""
    return _token_set_revoked(token_id=token_id, actor=actor, revoked=True)


def operator_token_restore(*, token_id: Any, actor: Principal) -> bool:
    """An operator restores a revoked token. False when it was not revoked."""
    return _token_set_revoked(token_id=token_id, actor=actor, revoked=False)


def operator_tokens_named_set_revoked(*, name: str, revoked: bool, actor: Principal) -> tuple[int, int]:
    """Revoke (or restore) the operator tokens named `name`, each as `operator_token_revoke` (or
    `_restore`) does. Returns (how many changed, how many are named so). Names are not unique:
    revoking takes every token of the name; restoring takes the one revoked token of the name, and
    is refused (Conflict) when several are, since which one is meant would be a guess (one of
    them may have leaked). No token of that name: NotFound."""
    tokens = dict(OperatorToken.objects.filter(name=name).values_list("pk", "revoked"))
    if not tokens:
        raise NotFound(f"No operator token is named {name!r}.")
    if not revoked and sum(tokens.values()) > 1:
        raise Conflict(
            f"{sum(tokens.values())} revoked operator tokens are named {name!r}: restoring one by name "
            "would be a guess. Restore it in the Django admin, or mint a new token."
        )
    changed = sum(_token_set_revoked(token_id=pk, actor=actor, revoked=revoked) for pk in tokens)
    return changed, len(tokens)


def _token_set_revoked(*, token_id: Any, actor: Principal, revoked: bool) -> bool:
    # An operator, or the hub itself: a management command run on the hub's machine, by someone
    # who can already read its database. Never a session.
    if actor.kind != "hub":
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
