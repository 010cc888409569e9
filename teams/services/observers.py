"""Observers: a session paired with one target (a session, or a team's lead) that may only send
one-way observer reports to it. It sends no ordinary message, receives none, and its reports are
marked `KIND=observer_report TRUST=observer-report`, so they grant no authority.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from messaging.errors import Conflict, Forbidden, Invalid, NotFound
from messaging.models import AgentSession, MessageKind
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.services.events import announce
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sending import SendOutcome
from teams.models import Membership, Observer, Team

OBSERVER_TRUST = "observer-report"


def observer_register(
    *,
    session: AgentSession,
    actor: Principal,
    target_session: AgentSession | None = None,
    target_team: Team | None = None,
) -> Observer:
    """Make `session` an observer of one target. A session may restrict itself; an operator may
    register any session. A member of a team cannot observe (leave the roster first). Once a
    session is an observer, only an operator changes its registration (as only an operator lifts
    it): the observer itself may repeat the same registration, never retarget it."""
    if not actor.is_self_or_operator(session):
        raise Forbidden("A session registers only itself as an observer (an operator may register any).")
    if (target_session is None) == (target_team is None):
        raise Invalid("bad_observer_target", "Name exactly one target: a session or a team.")
    if target_session is not None and target_session.id == session.id:
        raise Invalid("self_target", "A session cannot observe itself.")
    if target_team is not None and target_team.ended_at is not None:
        raise Conflict("That team has ended.", reason="team_ended")
    if Membership.objects.filter(session=session, left_at__isnull=True).exists():
        raise Conflict("A team member cannot be an observer; leave the roster first.", reason="member")
    with transaction.atomic():
        existing = Observer.objects.select_for_update().filter(session=session).first()
        if existing is not None and not actor.is_operator:
            if (existing.target_session_id, existing.target_team_id) == (
                target_session.id if target_session else None,
                target_team.id if target_team else None,
            ):
                return existing  # the same registration again: nothing changes
            raise Forbidden(
                f"{session.label} is already an observer (registered by {existing.registered_by}); "
                "only an operator changes an observer's target.",
                reason="observer",
            )
        observer, created = Observer.objects.update_or_create(
            session=session,
            defaults={
                "target_session": target_session,
                "target_team": target_team,
                "registered_by": actor.actor,
            },
        )
        audit_event(
            "observer.registered",
            actor=actor.actor,
            target=str(session.id),
            detail={
                "target_session": str(target_session.id) if target_session else None,
                "target_team": str(target_team.id) if target_team else None,
            },
        )
        announce("observer.changed", observer_summary(observer), sessions=[session.id])
    return observer


def observer_unregister(*, session: AgentSession, actor: Principal) -> None:
    """Only an operator lifts an observer's restriction (the observer cannot free itself)."""
    actor.require_operator()
    with transaction.atomic():
        deleted, _ = Observer.objects.filter(session=session).delete()
        if not deleted:
            raise NotFound(f"{session.label} is not an observer.")
        audit_event("observer.unregistered", actor=actor.actor, target=str(session.id))


def observer_target_session(observer: Observer) -> AgentSession:
    if observer.target_session_id:
        return observer.target_session  # type: ignore[return-value]
    team = observer.target_team
    assert team is not None
    if team.ended_at is not None:
        raise Conflict(
            "The team you observe has ended; your reports have nowhere to go.", reason="team_ended"
        )
    return team.lead_session


def observer_check_send(*, sender: AgentSession, recipient: AgentSession, kind: str) -> str | None:
    """Called by the send service for every send. Raises Forbidden for what observers may not do;
    returns the trust marker an observer report carries (None for everything else)."""
    rows = {
        o.session_id: o
        for o in Observer.objects.filter(session_id__in=[sender.id, recipient.id]).select_related(
            "target_team"
        )
    }
    if recipient.id in rows:
        raise Forbidden(
            f"{recipient.label} is an observer; observers receive no messages.", reason="observer"
        )
    mine = rows.get(sender.id)
    if kind == MessageKind.OBSERVER_REPORT:
        if mine is None:
            raise Forbidden("Only a registered observer sends observer reports.", reason="not_observer")
        if observer_target_session(mine).id != recipient.id:
            raise Forbidden("An observer reports only to its own target.", reason="observer")
        return OBSERVER_TRUST
    if mine is not None:
        raise Forbidden(
            "You are registered as an observer: you can only send observer reports to your target "
            "(POST /api/v1/teams/observers/report).",
            reason="observer",
        )
    return None


def observer_report(*, session: AgentSession, actor: Principal, text: str, summary: str = "") -> SendOutcome:
    """Send a one-way observer report to the observer's target."""
    observer = (
        Observer.objects.select_related("target_session", "target_team").filter(session=session).first()
    )
    if observer is None:
        raise Forbidden("You are not registered as an observer.", reason="not_observer")
    target = observer_target_session(observer)
    return message_send(
        SendRequest(
            sender=session,
            to=str(target.id),
            text=text,
            summary=summary,
            kind=MessageKind.OBSERVER_REPORT,
            actor=actor,
        )
    )


def observer_summary(observer: Observer) -> dict[str, Any]:
    return {
        "session": str(observer.session_id),
        "target_session": str(observer.target_session_id) if observer.target_session_id else None,
        "target_team": str(observer.target_team_id) if observer.target_team_id else None,
        "registered_by": observer.registered_by,
        "created_at": observer.created_at.isoformat() if observer.created_at else None,
    }
