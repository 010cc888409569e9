"""Read-only questions other apps ask about teams."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Q

from messaging.models import AgentSession
from messaging.principals import Principal
from teams.models import FrameRequest, GateCheck, Membership, Role, Subscription, Task, Team


def team_roster_ids(team: Team) -> set[Any]:
    """The id of every session that was ever on the team's roster (members who left included),
    the lead's too: whose messages are the team's conversation."""
    roster = set(team.memberships.values_list("session_id", flat=True))
    roster.add(team.lead_session_id)
    return roster


def lead_session_of(session: AgentSession) -> AgentSession | None:
    """The lead of the team `session` is a teammate in, or None when it is in no team."""
    member = (
        Membership.objects.filter(
            session=session, role=Role.TEAMMATE, left_at__isnull=True, team__ended_at__isnull=True
        )
        .select_related("team__lead_session")
        .first()
    )
    return member.team.lead_session if member else None


def memberships_that_read_their_team() -> Q:
    """The membership rows that let their session read their team (board, tasks, roster, gates,
    requests): the one rule every team read applies (`team_require_visible`, `teams_visible`).

    A live team is read by its current roster only: a member that left, or that its lead or an
    operator took off, loses sight of it at once, work done after it left included. An ended team
    is read, as history, by the members on its roster when it ended (`team_end` writes the same
    instant to `ended_at` and to their `left_at`); a member that had left before stays out.
    (A live row, `left_at` null, on an ended team is one that joined as the team ended.)"""
    return Q(left_at__isnull=True) | Q(team__ended_at__isnull=False, left_at__gte=F("team__ended_at"))


def teams_visible(*, viewer: Principal, include_ended: bool = False) -> list[Team]:
    """Every team for an operator; for a session, the live team it is on and the ended teams it
    was on when they ended (see `memberships_that_read_their_team`)."""
    qs = Team.objects.all().order_by("-created_at")
    if not viewer.is_operator:
        member_rows = Membership.objects.filter(session=viewer.require_session()).filter(
            memberships_that_read_their_team()
        )
        qs = qs.filter(pk__in=member_rows.values("team_id"))
    if not include_ended:
        qs = qs.filter(ended_at__isnull=True)
    return list(qs[:500])


def tasks_of_team(*, team: Team, status: str | None = None, owner: Any = None) -> list[Task]:
    qs = Task.objects.filter(team=team).select_related("owner").order_by("id")
    if status:
        qs = qs.filter(status=status)
    if owner:
        qs = qs.filter(owner_id=owner)
    return list(qs[:1000])


def requests_of_team(*, team: Team, state: str | None = None) -> list[FrameRequest]:
    qs = (
        FrameRequest.objects.filter(team=team)
        .select_related("requester", "responder")
        .order_by("-created_at")
    )
    if state:
        qs = qs.filter(state=state)
    return list(qs[:500])


def gate_checks_of_team(*, team: Team) -> list[GateCheck]:
    return list(GateCheck.objects.filter(team=team).order_by("-id")[:200])


def subscriptions_of(*, session: AgentSession) -> list[Subscription]:
    return list(Subscription.objects.filter(subscriber=session).order_by("-created_at")[:200])
