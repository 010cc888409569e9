"""Teams and their roster: create, add a teammate, leave, end, and the checks every team call makes."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from messaging.errors import Conflict, Forbidden, Invalid, NotFound, RateLimited
from messaging.metrics import RATE_LIMIT_REFUSALS
from messaging.models import AgentSession, SessionStatus
from messaging.names import clean_name, name_problem, normalize_name
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.services.events import announce
from messaging.services.limits import bucket_take
from teams.models import (
    FrameRequest,
    Membership,
    Observer,
    RequestState,
    Role,
    Task,
    TaskStatus,
    Team,
)
from teams.selectors import memberships_that_read_their_team


def live_membership(session: AgentSession | Any) -> Membership | None:
    """The session's place on a live roster, or None."""
    return (
        Membership.objects.select_related("team", "session")
        .filter(session_id=getattr(session, "id", session), left_at__isnull=True, team__ended_at__isnull=True)
        .first()
    )


def team_get(*, team_id: Any) -> Team:
    """The team with that id, or NotFound."""
    try:
        return Team.objects.select_related("lead_session").get(pk=team_id)
    except (Team.DoesNotExist, ValueError, Exception) as exc:  # a malformed UUID raises ValidationError
        raise NotFound("No team with that id.") from exc


def team_get_visible(*, team_id: Any, actor: Principal) -> Team:
    """The team with that id, for a caller that reads it (`team_require_visible`). Every route
    that names a team by id starts here, whatever it then does: a team the caller does not read
    gets the very answer of an id no team has. So neither a read nor an action (ending it,
    inviting, taking a member off, a message, a frame, a gate, a task) tells a former member, or
    any other session holding the id, whether the team still runs, who leads it or who left it."""
    try:
        team = team_get(team_id=team_id)
        team_require_visible(team=team, actor=actor)
    except NotFound:
        raise NotFound("No team with that id is visible to you.") from None
    return team


def team_require_visible(*, team: Team, actor: Principal) -> Membership | None:
    """The check before every read of a team (roster, board, a task, gates, requests). Operators
    read every team (None); a session reads the live team it is on now, and an ended team it was
    on when it ended (`memberships_that_read_their_team`), and gets its membership. Anyone else
    gets NotFound, as if the team did not exist: a former member of a live team learns nothing."""
    if actor.is_operator:
        return None
    session = actor.require_session()
    member = (
        Membership.objects.filter(team=team, session=session)
        .filter(memberships_that_read_their_team())
        .order_by("-joined_at")
        .first()
    )
    if member is None:
        raise NotFound("No team with that id is visible to you.")
    return member


def member_require_lead(*, team: Team, actor: Principal) -> Membership | None:
    """The caller's lead membership of a live team (None for an operator); Forbidden otherwise."""
    team_require_live(team=team)
    if actor.is_operator:
        return None
    session = actor.require_session()
    member = Membership.objects.filter(team=team, session=session, left_at__isnull=True).first()
    if member is None or member.role != Role.LEAD:
        raise Forbidden("Only the team's lead (or an operator) may do this.")
    return member


def member_require_live(*, team: Team, member_id: Any) -> Membership:
    """A member id that is still on this team's roster. A stale id is refused, never re-pointed."""
    try:
        member = Membership.objects.select_related("session", "team").get(pk=member_id, team=team)
    except (Membership.DoesNotExist, ValueError, Exception) as exc:
        raise NotFound(f"No member {member_id} on this team's roster.") from exc
    if member.left_at is not None or member.team.ended_at is not None:
        raise Conflict(
            f"Member {member.name} ({member.id}) is no longer on the roster; nothing was sent. "
            "Read the roster again (GET /api/v1/teams/{id}) and use a current member id.",
            reason="stale_member",
        )
    return member


def member_of_caller(*, team: Team, actor: Principal, operators: bool = False) -> Membership | None:
    """The caller's live membership of a live `team`. With `operators`, an operator passes too
    (and gets None); otherwise the caller must be a session on the roster."""
    team_require_live(team=team)
    if operators and actor.is_operator:
        return None
    session = actor.require_session()
    found = (
        Membership.objects.select_related("session")
        .filter(team=team, session=session, left_at__isnull=True)
        .first()
    )
    if found is None:
        raise Forbidden("You are not on this team's roster.")
    return found


def requests_close(requests: QuerySet[FrameRequest], *, state: str, reason: str, now: Any) -> int:
    """Close open protocol requests and expire their request frames still waiting in an inbox, so a
    teammate never acts on a request that no longer stands. Run inside a transaction."""
    from messaging.models import Delivery
    from messaging.principals import HUB
    from messaging.services.delivery import delivery_transition
    from messaging.states import DeliveryState

    rows = list(requests.filter(state=RequestState.OPEN).values_list("id", "request_message_id"))
    if not rows:
        return 0
    closed = FrameRequest.objects.filter(pk__in=[r[0] for r in rows], state=RequestState.OPEN).update(
        state=state, answered_at=now, reason=reason
    )
    messages = [m for _, m in rows if m]
    if messages:
        delivery_transition(
            Delivery.objects.filter(message_id__in=messages),
            to=DeliveryState.EXPIRED,
            actor=HUB,
            reason=f"request {state}",
        )
    return closed


def team_require_live(*, team: Team) -> None:
    if team.ended_at is not None:
        raise Conflict("This team has ended; its tasks and history are kept read-only.", reason="team_ended")


def team_change_bounded(*, actor: Principal) -> None:
    """Spend one of the session's team changes (create or end a team, invite, ask to join,
    withdraw an invitation or a request to join): SWITCHBOARD_TEAM_CHANGE_RATE per SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS,
    on the store the send limits use. Each change writes rows and audit events, so one token
    churning teams or invitations at request speed would write without bound. Called after the
    caller's own checks and before any write: a refusal (429 `team_rate`) writes nothing. An
    operator (and the hub) is not counted."""
    if actor.session is None or actor.is_operator:
        return
    wait = bucket_take(
        "team_change",
        actor.session.id,
        capacity=settings.SWITCHBOARD_TEAM_CHANGE_RATE,
        per=settings.SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS,
    )
    if wait:
        RATE_LIMIT_REFUSALS.labels("team_rate").inc()
        raise RateLimited(
            f"This session is changing teams and invitations faster than "
            f"{settings.SWITCHBOARD_TEAM_CHANGE_RATE} changes per "
            f"{settings.SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS} s; nothing changed. Wait "
            f"{math.ceil(wait)} s and try again.",
            reason="team_rate",
            retry_after=math.ceil(wait),
        )


def _member_name(session: AgentSession, name: str | None) -> tuple[str, str]:
    chosen = name if name else session.name
    problem = name_problem(chosen)
    if problem:
        raise Invalid("bad_name", problem)
    chosen = clean_name(chosen)
    return chosen, normalize_name(chosen)


def _require_not_exited(session: AgentSession) -> None:
    if session.status == SessionStatus.EXITED:
        raise Conflict(f"{session.label} has exited.", reason="session_exited")


def _require_free(session: AgentSession) -> None:
    _require_not_exited(session)
    if Observer.objects.filter(session=session).exists():
        raise Conflict(f"{session.label} is an observer; observers cannot join a team.", reason="observer")


def team_create(*, lead: AgentSession, name: str, actor: Principal) -> Team:
    """Create a team led by `lead`. A session leads at most one live team; a teammate leads none."""
    _require_free(lead)
    current = live_membership(lead)
    if current is not None:
        if current.role == Role.TEAMMATE:
            raise Forbidden("A teammate cannot create a team: teams do not nest.", reason="nested_team")
        raise Conflict(
            f"You already lead the team {current.team.name} ({current.team.id}).", reason="already_lead"
        )
    member_name, key = _member_name(lead, None)
    team_name = (name or "").strip() or f"team-{lead.name}"
    if len(team_name) > 64:
        raise Invalid("bad_team_name", "A team name takes at most 64 characters.")
    team_change_bounded(actor=actor)
    try:
        with transaction.atomic():
            team = Team.objects.create(name=team_name, lead_session=lead)
            member = Membership.objects.create(
                team=team, session=lead, role=Role.LEAD, name=member_name, name_key=key
            )
            audit_event(
                "team.created",
                actor=actor.actor,
                target=str(team.id),
                detail={"lead": str(lead.id), "member": str(member.id)},
            )
            announce("team.changed", team_summary(team), teams=[team.id], sessions=[lead.id])
    except IntegrityError as exc:
        raise Conflict("This session is already on a team.", reason="already_member") from exc
    return team


def team_add_member(
    *, team: Team, session: AgentSession, actor: Principal, name: str | None = None
) -> Membership:
    """An operator puts `session` on the roster at once. A lead cannot: it invites, and the session
    joins when it accepts (teams.services.invitations)."""
    actor.require_operator()
    return roster_join(team=team, session=session, actor=actor, name=name)


def roster_check_free(*, session: AgentSession, name: str | None) -> tuple[str, str]:
    """Refuse a session that cannot join any team now (exited, an observer, on a roster, a bad
    name): facts of the session alone. Return its roster name and that name's key."""
    _require_free(session)
    if live_membership(session) is not None:
        raise Conflict(f"{session.label} is already on a team's roster.", reason="already_member")
    return _member_name(session, name)


def roster_check_invitable(*, team: Team, session: AgentSession, name: str | None) -> tuple[str, str]:
    """Refuse what a lead may be told before it invites `session` to `team`: the team has ended,
    the session has exited (every session sees that), the roster name is bad, or the session is on
    this team's roster already (the lead reads its own roster). Whether the session is on another
    team's roster or an observer is not for a lead to learn, and any session can lead a team: the
    invitation opens all the same, and the session's own accept answers that it cannot join
    (`roster_check_joinable`). Return its roster name and that name's key."""
    team_require_live(team=team)
    _require_not_exited(session)
    if Membership.objects.filter(team=team, session=session, left_at__isnull=True).exists():
        raise Conflict(f"{session.label} is already on your team's roster.", reason="already_member")
    return _member_name(session, name)


def roster_check_joinable(*, team: Team, session: AgentSession, name: str | None) -> tuple[str, str]:
    """Refuse a session that cannot join `team` now; return its roster name and that name's key."""
    team_require_live(team=team)
    return roster_check_free(session=session, name=name)


def roster_join(
    *, team: Team, session: AgentSession, actor: Principal, name: str | None = None
) -> Membership:
    """Put `session` on the roster as a teammate. Call it only once joining is consented to: by an
    operator, or by both the lead and the session (an accepted invitation). Returns the member."""
    member_name, key = roster_check_joinable(team=team, session=session, name=name)
    try:
        with transaction.atomic():
            member = Membership.objects.create(
                team=team, session=session, role=Role.TEAMMATE, name=member_name, name_key=key
            )
            audit_event(
                "team.member_joined",
                actor=actor.actor,
                target=str(team.id),
                detail={"member": str(member.id), "session": str(session.id), "name": member_name},
            )
            announce("team.changed", team_summary(team), teams=[team.id], sessions=[session.id])
    except IntegrityError as exc:
        raise Conflict(
            f"The roster already has a member named {member_name!r} (or that session is on a team); "
            "pick another name.",
            reason="name_taken",
        ) from exc
    return member


def member_leave(*, member: Membership, actor: Principal, why: str = "left") -> Membership:
    """Take a teammate off the roster (itself, its lead, an operator, or the hub on exit).

    Its unfinished tasks go back on the board unowned. The member id is never reused."""
    team = member.team
    if member.role == Role.LEAD:
        raise Invalid("lead_cannot_leave", "The lead does not leave its team; end the team instead.")
    if actor.kind == "session":
        assert actor.session is not None
        is_self = actor.session.id == member.session_id
        is_lead = Membership.objects.filter(
            team=team, session=actor.session, role=Role.LEAD, left_at__isnull=True
        ).exists()
        if not (is_self or is_lead):
            raise Forbidden("Only the member itself or its lead may take it off the roster.")
    now = timezone.now()
    with transaction.atomic():
        if Membership.objects.filter(pk=member.pk, left_at__isnull=True).update(left_at=now) == 0:
            member.refresh_from_db()
            return member
        member.left_at = now
        _return_tasks_of(member)
        requests_close(
            FrameRequest.objects.filter(state=RequestState.OPEN, responder=member),
            state=RequestState.CANCELLED,
            reason=f"member {why}",
            now=now,
        )
        audit_event(
            "team.member_left",
            actor=actor.actor,
            target=str(team.id),
            detail={"member": str(member.id), "why": why},
        )
        announce("team.changed", team_summary(team), teams=[team.id], sessions=[member.session_id])
    return member


def _return_tasks_of(member: Membership) -> None:
    from django.db.models import F

    Task.objects.filter(owner=member).exclude(status__in=[TaskStatus.COMPLETED, TaskStatus.REJECTED]).update(
        owner=None, status=TaskStatus.PENDING, gate_pending="", revision=F("revision") + 1
    )


def team_end(*, team: Team, actor: Principal, why: str = "ended") -> Team:
    """End a team (its lead or an operator). Its open invitations are cancelled, the roster
    empties; tasks and history stay."""
    from teams.services.invitations import invitations_cancel_for_team

    if actor.kind != "hub":
        member_require_lead(team=team, actor=actor)
    if team.ended_at is None:  # ending an ended team again writes nothing
        team_change_bounded(actor=actor)
    now = timezone.now()
    with transaction.atomic():
        if (
            Team.objects.filter(pk=team.pk, ended_at__isnull=True).update(ended_at=now, ended_by=actor.actor)
            == 0
        ):
            team.refresh_from_db()
            return team
        team.ended_at = now
        team.ended_by = actor.actor
        invitations_cancel_for_team(team=team, actor=actor)  # while the lead is on the roster
        Membership.objects.filter(team=team, left_at__isnull=True).update(left_at=now)
        requests_close(
            FrameRequest.objects.filter(team=team, state=RequestState.OPEN),
            state=RequestState.CANCELLED,
            reason="team ended",
            now=now,
        )
        audit_event("team.ended", actor=actor.actor, target=str(team.id), detail={"why": why})
        announce("team.changed", team_summary(team), teams=[team.id])
    return team


def teams_purge_ended(*, now: Any = None) -> int:
    """Delete teams ended longer ago than the retention setting, with their tasks. Returns how many."""
    days = settings.SWITCHBOARD_TEAM_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    doomed = list(Team.objects.filter(ended_at__lt=cutoff).values_list("id", flat=True)[:500])
    if not doomed:
        return 0
    with transaction.atomic():
        Team.objects.filter(pk__in=doomed).delete()
        for team_id in doomed:
            audit_event("team.purged", actor="hub", target=str(team_id))
    return len(doomed)


def member_summary(member: Membership) -> dict[str, Any]:
    """A roster entry as the API and live events show it."""
    from messaging.services.sessions import session_summary

    session = member.session
    summary = session_summary(session)
    return {
        "member_id": str(member.id),
        "name": member.name,
        "role": member.role,
        "joined_at": member.joined_at.isoformat() if member.joined_at else None,
        "left_at": member.left_at.isoformat() if member.left_at else None,
        "session": {
            "id": str(session.id),
            "name": session.name,
            "ref": session.ref,
            "status": session.status,
            "liveness": summary.get("liveness", session.status),
            "dead": summary.get("dead", False),
            "last_seen": summary["last_seen"],
        },
    }


def team_summary(team: Team, *, include_left: bool = False) -> dict[str, Any]:
    """A team and its roster (live members, or all with `include_left`)."""
    members = Membership.objects.filter(team=team).select_related("session").order_by("joined_at")
    if not include_left:
        members = members.filter(left_at__isnull=True) if team.ended_at is None else members
    return {
        "id": str(team.id),
        "name": team.name,
        "lead_session": str(team.lead_session_id),
        "live": team.ended_at is None,
        "created_at": team.created_at.isoformat() if team.created_at else None,
        "ended_at": team.ended_at.isoformat() if team.ended_at else None,
        "members": [member_summary(m) for m in members],
    }
