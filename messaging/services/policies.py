"""Setting inbound policy: a session's general policy and its per-sender overrides.

Operators may set anything for any session (what they set becomes the session's floor). A session
may set only its own policy, and only stricter than its floor; it can never touch another's.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from messaging.errors import Forbidden, Invalid
from messaging.models import AgentSession, SenderPolicy
from messaging.policy import ACTIONS, inbound_decide, is_looser
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.services.events import announce

MAX_HOLD_EXPIRY_SECONDS = 7 * 24 * 3600


def _check_action(value: str | None, field: str) -> None:
    if value is not None and value not in ACTIONS:
        raise Invalid(f"bad_{field}", f"{field} is one of accept, hold, refuse (or null to clear it).")


def _require_self_or_operator(actor: Principal, session: AgentSession) -> None:
    if actor.is_operator:
        return
    if actor.kind == "session" and actor.session is not None and actor.session.id == session.id:
        return
    raise Forbidden(
        "Only an operator may change another session's policy. A message or a session token is never consent."
    )


def policy_set(
    *,
    session: AgentSession,
    policy: str | None,
    actor: Principal,
    hold_expiry_seconds: int | None = None,
    sensitive_exempt: bool | None = None,
) -> AgentSession:
    """Set `session`'s inbound policy. An operator sets the floor (`operator_policy`) and may set
    the hold expiry and the sensitive exemption; the session itself sets its own policy, never
    looser than the floor. Every part of the request is checked before anything is written, and
    all of it is written in one transaction: a refused request changes nothing."""
    _check_action(policy, "policy")
    _require_self_or_operator(actor, session)
    if hold_expiry_seconds is not None and not (1 <= hold_expiry_seconds <= MAX_HOLD_EXPIRY_SECONDS):
        raise Invalid("bad_hold_expiry", f"hold_expiry_seconds is between 1 and {MAX_HOLD_EXPIRY_SECONDS}.")
    if not actor.is_operator:
        if hold_expiry_seconds is not None:
            raise Forbidden("Only an operator may change how long holds wait.")
        if sensitive_exempt is not None:
            raise Forbidden("Only an operator may exempt a sender's sensitive messages from holds.")
    with transaction.atomic():
        locked = AgentSession.objects.select_for_update().get(pk=session.pk)
        before = {
            "inbound_policy": locked.inbound_policy,
            "operator_policy": locked.operator_policy,
            "hold_expiry_seconds": locked.hold_expiry_seconds,
            "sensitive_exempt": locked.sensitive_exempt,
        }
        if not actor.is_operator and is_looser(policy, locked.operator_policy):
            raise Forbidden(
                f"An operator set this session's policy to {locked.operator_policy}; "
                "you may make it stricter, never looser."
            )
        if actor.is_operator:
            # The operator's word is now the policy; the session may tighten it again afterwards.
            locked.operator_policy = policy
            locked.inbound_policy = None
            if hold_expiry_seconds is not None:
                locked.hold_expiry_seconds = hold_expiry_seconds
            if sensitive_exempt is not None:
                locked.sensitive_exempt = sensitive_exempt
        else:
            locked.inbound_policy = policy
        locked.save(update_fields=list(before))
        after = {k: getattr(locked, k) for k in before}
        audit_event(
            "session.policy",
            actor=actor.actor,
            target=str(locked.id),
            detail={"before": before, "after": after},
        )
        if before["sensitive_exempt"] != after["sensitive_exempt"]:
            audit_event(
                "session.sensitive_exempt",
                actor=actor.actor,
                target=str(locked.id),
                detail={"exempt": after["sensitive_exempt"]},
            )
        announce("session.policy", {"id": str(locked.id), **after}, sessions=[locked.id])
    session.__dict__.update(after)
    return locked


def sender_policy_set(
    *, recipient: AgentSession, sender: AgentSession, action: str | None, actor: Principal
) -> None:
    """Set (or clear, with None) how `recipient` treats messages from `sender`. A session may set
    overrides on itself only; an operator's override can only be changed by an operator."""
    _check_action(action, "action")
    _require_self_or_operator(actor, recipient)
    if recipient.id == sender.id:
        raise Invalid("self_target", "A session does not send to itself; there is nothing to override.")
    with transaction.atomic():
        existing = SenderPolicy.objects.select_for_update().filter(recipient=recipient, sender=sender).first()
        if not actor.is_operator:
            if existing is not None and existing.by_operator:
                raise Forbidden("An operator set this rule; only an operator may change it.")
            floor = recipient.operator_policy
            if is_looser(action, floor):
                raise Forbidden(
                    f"An operator set this session's policy to {floor}; you may make it stricter, never looser."
                )
        before = existing.action if existing else None
        if action is None:
            if existing is not None:
                existing.delete()
        else:
            SenderPolicy.objects.update_or_create(
                recipient=recipient,
                sender=sender,
                defaults={"action": action, "set_by": actor.actor, "by_operator": actor.is_operator},
            )
        audit_event(
            "session.sender_policy",
            actor=actor.actor,
            target=str(recipient.id),
            detail={"sender": str(sender.id), "before": before, "after": action},
        )
        announce(
            "session.policy",
            {"id": str(recipient.id), "sender": str(sender.id), "action": action},
            sessions=[recipient.id],
        )


def session_sensitive_exempt_set(*, session: AgentSession, exempt: bool, actor: Principal) -> AgentSession:
    """Operators only: let sensitive messages from this sender through policy (escalate=none)
    when its identity is verified. A failed signature is never exempt."""
    actor.require_operator()
    with transaction.atomic():
        AgentSession.objects.filter(pk=session.pk).update(sensitive_exempt=exempt)
        audit_event(
            "session.sensitive_exempt", actor=actor.actor, target=str(session.id), detail={"exempt": exempt}
        )
    session.sensitive_exempt = exempt
    return session


def policy_view(*, session: AgentSession) -> dict[str, Any]:
    """A session's policy as the API shows it: what is set, and what applies to each sender mode."""
    overrides = [
        {
            "sender": {"id": str(p.sender.id), "name": p.sender.name, "ref": p.sender.ref},
            "action": p.action,
            "by_operator": p.by_operator,
            "set_by": p.set_by,
        }
        for p in SenderPolicy.objects.filter(recipient=session).select_related("sender").order_by("id")
    ]
    effective = {
        mode: inbound_decide(
            receiver_mode=session.permission_mode,
            sender_mode=mode,
            receiver_policy=session.inbound_policy,
            operator_policy=session.operator_policy,
        ).action
        for mode in ("default", "bypass")
    }
    return {
        "id": str(session.id),
        "inbound_policy": session.inbound_policy,
        "operator_policy": session.operator_policy,
        "permission_mode": session.permission_mode,
        "hold_expiry_seconds": session.hold_expiry_seconds,
        "headless": session.headless,
        "sensitive_exempt": session.sensitive_exempt,
        "effective": effective,
        "overrides": overrides,
    }


__all__ = [
    "policy_set",
    "policy_view",
    "sender_policy_set",
    "session_sensitive_exempt_set",
]
