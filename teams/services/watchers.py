"""Who may read a session's final answers: its lead, its teammates, and the watchers it allowed.

A fired notify-when-idle subscription tells every subscriber that the target is idle, but carries
the target's final answer only to a reader `final_answer_allowed` accepts. A session allows a
watcher for itself; an operator allows one for any session. Either revokes it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from messaging.errors import Forbidden, Invalid, NotFound
from messaging.models import AgentSession
from messaging.principals import Principal
from messaging.services.audit import audit_event
from teams.models import Membership, Watcher


def final_answer_allowed(*, reader: AgentSession, target: AgentSession) -> bool:
    """True when `reader` may read `target`'s final answer: it shares a live team with it (as its
    lead or a teammate), or the target or an operator allowed it as a watcher."""
    if Watcher.objects.filter(target=target, watcher=reader).exists():
        return True
    teams = Membership.objects.filter(session=target, left_at__isnull=True, team__ended_at__isnull=True)
    return Membership.objects.filter(
        session=reader, left_at__isnull=True, team_id__in=teams.values("team_id")
    ).exists()


def watcher_allow(*, target: AgentSession, watcher: AgentSession, actor: Principal) -> Watcher:
    """Let `watcher` read `target`'s final answers: the target itself, or an operator."""
    if not actor.is_operator and actor.require_session().id != target.id:
        raise Forbidden(
            "Only the session itself (or an operator) allows who reads its final answers.",
            reason="not_target",
        )
    if watcher.id == target.id:
        raise Invalid("self_target", "A session always reads its own final answers.")
    with transaction.atomic():
        grant, created = Watcher.objects.get_or_create(
            target=target, watcher=watcher, defaults={"granted_by": actor.actor}
        )
        if created:
            audit_event(
                "watcher.allowed",
                actor=actor.actor,
                target=str(target.id),
                detail={"watcher": str(watcher.id), "grant": grant.pk},
            )
    return grant


def watcher_revoke(*, grant_id: Any, actor: Principal) -> Watcher:
    """Withdraw a grant: the target session that made it, or an operator. Grant ids count up, so
    another session's grant answers exactly as an id no grant has: one NotFound for both."""
    missing = NotFound("No such watcher grant of yours.")
    try:
        grant = Watcher.objects.select_related("target", "watcher").get(pk=int(grant_id))
    except (Watcher.DoesNotExist, ValueError, TypeError):
        raise missing from None
    if not actor.is_operator and actor.require_session().id != grant.target_id:
        raise missing
    with transaction.atomic():
        Watcher.objects.filter(pk=grant.pk).delete()
        audit_event(
            "watcher.revoked",
            actor=actor.actor,
            target=str(grant.target_id),
            detail={"watcher": str(grant.watcher_id), "grant": grant_id},
        )
    return grant


def watchers_visible(*, actor: Principal, target: AgentSession | None = None) -> list[Watcher]:
    """A session's own grants (who may read its final answers); every grant, or one target's, for
    an operator."""
    qs = Watcher.objects.select_related("target", "watcher")
    if not actor.is_operator:
        qs = qs.filter(target=actor.require_session())
    elif target is not None:
        qs = qs.filter(target=target)
    return list(qs[:500])


def watcher_summary(grant: Watcher) -> dict[str, Any]:
    return {
        "id": grant.pk,
        "target": str(grant.target_id),
        "watcher": str(grant.watcher_id),
        "watcher_label": grant.watcher.label,
        "granted_by": grant.granted_by,
        "created_at": grant.created_at.isoformat() if grant.created_at else None,
    }
