"""Joining a team takes two yeses: the lead's and the session's (or one operator's).

Joining matters to the session that joins: its final answer goes to the lead at every turn's end,
and it can join no other team meanwhile. So a lead cannot put an existing session on its roster by
itself. Either side opens an `Invitation`: the lead invites (`team_invite`), or the session asks to
join (`team_ask_to_join`). The other side accepts (the session joins then) or declines; asking from
the other side while one is open counts as accepting it, so a teammate that asked to join is on the
roster as soon as its lead adds it, with no further step. An operator adds a session directly
(`teams.services.teams.team_add_member`). A session that asks keeps its own `JoinRequest`, which
it lists and withdraws whoever it asked (`join_requests_of`, `join_request_withdraw`).
A lead hears of the requests to its team through one notice, rewritten as they come and go
(`_tell_lead_of_asks`), and lists them all (`invitations_visible`).
Invitations and requests expire after SWITCHBOARD_TEAM_INVITATION_SECONDS. However an invitation
closes (answered, withdrawn, its team ended, lapsed), its unread notice goes with it (`_close`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from messaging.errors import Conflict, Forbidden, NotFound
from messaging.models import AgentSession
from messaging.principals import HUB, Principal
from messaging.services.audit import audit_event
from messaging.services.locks import lock_id, locks_taken
from teams.models import (
    Invitation,
    InvitationAsker,
    InvitationState,
    JoinRequest,
    Membership,
    Role,
    Team,
)
from teams.services.notify import frame_text, hub_notify, notice_withdraw
from teams.services.teams import (
    member_require_lead,
    roster_check_free,
    roster_check_invitable,
    roster_check_joinable,
    roster_join,
    team_add_member,
    team_change_bounded,
    team_require_live,
)

Asker = InvitationAsker


def team_invite(
    *, team: Team, session: AgentSession, actor: Principal, name: str | None = None
) -> tuple[Invitation | None, Membership | None]:
    """The lead invites `session` to its team (an operator adds it at once). Returns (invitation,
    None) while the session has not accepted; (the accepted invitation or None, member) once it is
    on the roster, which is at once when the session had asked to join this team. The invitation
    opens whether or not the session is on another roster or an observer: that is the session's
    to answer when it accepts, not the lead's to learn (`roster_check_invitable`)."""
    if actor.is_operator:
        return None, team_add_member(team=team, session=session, actor=actor, name=name)
    member_require_lead(team=team, actor=actor)
    team_change_bounded(actor=actor)
    return _say_yes(team=team, session=session, actor=actor, name=name, side=Asker.LEAD)


def team_ask_to_join(
    *, lead: AgentSession, actor: Principal, name: str | None = None
) -> tuple[JoinRequest | None, Membership | None]:
    """The calling session asks `lead` to let it join the team `lead` leads. If that lead has
    invited it, it joins now: (None, its member entry). Otherwise the lead is asked, and the
    answer is (the asker's join request, None); asking the same session again while that request
    is open returns it and tells nobody twice.

    Who leads which team is for its invitees and members to know: a session that was not invited
    gets the same answer (and the same refusals of its own standing) whether or not `lead` leads a
    team, and learns nothing of the team until its lead adds it. So every ask writes the asker's
    own `JoinRequest`, which it lists and withdraws alike whoever it asked; only a lead of a live
    team is also sent a request to answer (its `invitation`)."""
    session = actor.require_session()
    member_name, _ = roster_check_free(session=session, name=name)
    team_change_bounded(actor=actor)  # every ask alike, so the bound tells nothing of `lead` either
    led = Membership.objects.select_related("team").filter(
        session=lead, role=Role.LEAD, left_at__isnull=True, team__ended_at__isnull=True
    )
    team = led[0].team if led else None
    now = timezone.now()
    JoinRequest.objects.filter(
        asker=session, lead=lead, state=InvitationState.OPEN, expires_at__lte=now
    ).update(state=InvitationState.EXPIRED)
    if team is not None and _invited(team=team, session=session, now=now):
        member = _say_yes(team=team, session=session, actor=actor, name=name, side=Asker.SESSION)[1]
        if member is not None:
            return None, member
        # The invitation was withdrawn, lapsed or its team ended a moment ago: asked as by anyone.
    standing = JoinRequest.objects.filter(asker=session, lead=lead, state=InvitationState.OPEN).first()
    if standing is not None:
        return standing, None
    try:
        with transaction.atomic():
            invitation = None
            if team is not None:
                invitation, member = _say_yes(
                    team=team, session=session, actor=actor, name=name, side=Asker.SESSION
                )
                if member is not None:  # its lead invited it a moment ago
                    return None, member
            request = JoinRequest.objects.create(
                asker=session,
                lead=lead,
                name=member_name,
                invitation=invitation,
                expires_at=invitation.expires_at if invitation is not None else _expiry(now),
            )
            audit_event(
                "team.join_request_opened",
                actor=actor.actor,
                target=str(session.id),
                detail={"request": str(request.id), "lead": str(lead.id)},
            )
    except IntegrityError:
        # The same ask a moment ago opened it: the same request.
        raced = JoinRequest.objects.filter(asker=session, lead=lead, state=InvitationState.OPEN).first()
        if raced is None:
            raise
        return raced, None
    return request, None


def _invited(*, team: Team, session: AgentSession, now: Any) -> bool:
    """Has the lead of `team` an open invitation out to `session`?"""
    return Invitation.objects.filter(
        team=team, session=session, asked_by=Asker.LEAD, state=InvitationState.OPEN, expires_at__gt=now
    ).exists()


def _expiry(now: Any) -> Any:
    return now + timedelta(seconds=settings.SWITCHBOARD_TEAM_INVITATION_SECONDS)


def join_requests_of(*, actor: Principal) -> list[JoinRequest]:
    """The calling session's own open requests to join, newest first: whom it asked, whether or
    not that session leads a team (see `JoinRequest`)."""
    session = actor.require_session()
    return list(
        JoinRequest.objects.select_related("lead")
        .filter(asker=session, state=InvitationState.OPEN, expires_at__gt=timezone.now())
        .order_by("-created_at")[:200]
    )


def join_request_withdraw(*, request_id: Any, actor: Principal) -> JoinRequest:
    """The asker withdraws its own open request to join; the lead's request (if the session asked
    leads a team) is cancelled with it and its unread notice withdrawn. Only the asker: any other
    caller gets the NotFound an id no request has, so a request's existence is the asker's alone."""
    session = actor.require_session()
    try:
        request = JoinRequest.objects.select_related("lead").get(pk=request_id, asker=session)
    except (JoinRequest.DoesNotExist, ValidationError, ValueError) as exc:  # a malformed id: no request
        raise NotFound("No such request to join of yours.") from exc
    now = timezone.now()
    if request.state != InvitationState.OPEN or request.expires_at <= now:
        state = request.state if request.state != InvitationState.OPEN else InvitationState.EXPIRED
        raise Conflict(f"Request {request.id} is {state}; nothing changed.", reason="stale_invitation")
    team_change_bounded(actor=actor)
    answered = Conflict(f"Request {request.id} was answered a moment ago.", reason="stale_invitation")
    with transaction.atomic():
        # The invitation before the request, in the order a lead's answer (`_close`) takes them.
        invitation = (
            Invitation.objects.select_related("team", "session")
            .filter(pk=request.invitation_id, state=InvitationState.OPEN)
            .first()
        )
        if invitation is not None:
            try:
                _close(invitation, actor=actor, state=InvitationState.CANCELLED)
            except Conflict as exc:  # the lead answered it a moment ago; never name its invitation
                raise answered from exc
        if not JoinRequest.objects.filter(pk=request.pk, state=InvitationState.OPEN).update(
            state=InvitationState.CANCELLED, answered_at=now
        ):
            raise answered
        request.state, request.answered_at = InvitationState.CANCELLED, now
        audit_event(
            "team.join_request_withdrawn",
            actor=actor.actor,
            target=str(session.id),
            detail={"request": str(request.id), "lead": str(request.lead_id)},
        )
    return request


def join_requests_purge(*, now: Any = None, batch: int = 1000) -> int:
    """Delete requests to join that have been closed or lapsed for SWITCHBOARD_TEAM_INVITATION_SECONDS:
    every ask writes one, asks to sessions that lead no team included, and only open ones are
    listed, so without this they would pile up for as long as their asker lives. Returns how many."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.SWITCHBOARD_TEAM_INVITATION_SECONDS)
    done = JoinRequest.objects.filter(Q(expires_at__lt=cutoff) | Q(answered_at__lt=cutoff))
    ids = list(done.values_list("pk", flat=True)[:batch])
    return JoinRequest.objects.filter(pk__in=ids).delete()[0] if ids else 0


def join_request_summary(request: JoinRequest) -> dict[str, Any]:
    """A request to join as its asker sees it: whom it asked, never the team (see `JoinRequest`)."""
    return {
        "id": str(request.id),
        "lead": str(request.lead_id),
        "lead_label": request.lead.label,
        "name": request.name,
        "state": request.state,
        "created_at": request.created_at.isoformat() if request.created_at else None,
        "expires_at": request.expires_at.isoformat() if request.expires_at else None,
        "answered_at": request.answered_at.isoformat() if request.answered_at else None,
    }


def _say_yes(
    *, team: Team, session: AgentSession, actor: Principal, name: str | None, side: str
) -> tuple[Invitation | None, Membership | None]:
    """`side`'s yes to `session` joining `team`: (the open invitation, None), or (the accepted
    one, the member) when it was the second yes. (None, None) when the session asked and the team
    ended a moment ago: the caller answers as for a session that leads no team."""
    if side == Asker.LEAD:
        member_name, _ = roster_check_invitable(team=team, session=session, name=name)
    else:
        member_name, _ = roster_check_joinable(team=team, session=session, name=name)
    now = timezone.now()
    _lapse(Invitation.objects.filter(team=team, session=session), now=now)
    open_one = Invitation.objects.filter(team=team, session=session, state=InvitationState.OPEN).first()
    if open_one is not None and open_one.asked_by != side:
        # The other side said yes already: this is the second yes.
        return _accept(open_one, actor=actor, name=name)
    if open_one is not None:
        return open_one, None  # asking twice is the same request, and tells nobody twice
    try:
        with transaction.atomic():
            if not _lock_team(team):  # it ended a moment ago, after the checks above
                if side == Asker.SESSION:
                    return None, None  # as if `lead` led no team: the asker is not told it ended
                team.refresh_from_db()
                team_require_live(team=team)
            if side == Asker.LEAD:
                _require_room_for_invitation(session, now=now)
            invitation = Invitation.objects.create(
                team=team,
                session=session,
                name=member_name,
                asked_by=side,
                expires_at=_expiry(now),
            )
            audit_event(
                "team.invitation_opened",
                actor=actor.actor,
                target=str(team.id),
                detail={"invitation": str(invitation.id), "session": str(session.id), "asked_by": side},
            )
            _tell_other_side(invitation)
    except IntegrityError:
        # The other side opened one at the same moment; answer with the state now.
        raced = Invitation.objects.filter(team=team, session=session, state=InvitationState.OPEN).first()
        if raced is None:
            raise
        return (_accept(raced, actor=actor, name=name)) if raced.asked_by != side else (raced, None)
    return invitation, None


def _require_room_for_invitation(session: AgentSession, *, now: Any) -> None:
    """Refuse one more invitation to `session` while it holds SWITCHBOARD_INVITATIONS_PER_RECIPIENT
    open ones from the leads of all teams. The bound on invitation notices is per inviting lead, so
    without this, sessions that each lead a team would fill the session's inbox with the hub's
    notices (which no sender's share limits). The refusal names the cap, never how many invitations
    other teams sent, and writes nothing.

    Run inside the transaction that writes the invitation, after the team's lock (`_lock_team`):
    it holds the lock of invitations to `session` until that transaction ends, so leads of many
    teams inviting it at once are counted one after another and never pass the cap together. Only
    opening an invitation takes that lock, and always last, so it closes no cycle with the row
    locks other paths take (the team's, the session's)."""
    locks_taken([lock_id("team_invitations_to", str(session.pk))])
    cap = settings.SWITCHBOARD_INVITATIONS_PER_RECIPIENT
    held = Invitation.objects.filter(
        session=session, asked_by=Asker.LEAD, state=InvitationState.OPEN, expires_at__gt=now
    ).count()
    if held >= cap:
        raise Conflict(
            f"{session.label} holds as many open team invitations as a session may ({cap}); nothing "
            "was written. Invite it again once it has answered some, or they have lapsed.",
            reason="too_many_invitations",
        )


def _lead_of(team: Team) -> AgentSession:
    return (
        Membership.objects.select_related("session")
        .get(team=team, role=Role.LEAD, left_at__isnull=True)
        .session
    )


def _tell_other_side(invitation: Invitation) -> None:
    team, session = invitation.team, invitation.session
    lead = _lead_of(team)
    if invitation.asked_by == Asker.SESSION:
        _tell_lead_of_asks(team, lead=lead, why="")
        return
    accept = f"POST /api/v1/teams/invitations/{invitation.id}/accept"
    detail = (
        f"{lead.label}, lead of team {team.name!r}, invites you to join it as {invitation.name}. "
        "On a team your final answer goes to its lead each time your turn ends, and you join no "
        f"other team meanwhile. Accept: {accept} (MCP answer_invitation, CLI `switchboard team "
        f"accept {invitation.id}`); decline: .../decline. It is only an invitation: nothing "
        "changes unless you accept."
    )
    hub_notify(
        recipient=session,
        text=frame_text("team_invitation", _invitation_fields(invitation, lead=lead, detail=detail)),
        summary=f"{lead.name} invites you to team {team.name}",
        notice="team_invitation",
        # Bounded per inviting lead, not per team: a lead that ends its team and starts
        # another is the same source, so it cannot renew the bound with each new team.
        source=team.lead_session_id,
    )


def _invitation_fields(invitation: Invitation, *, lead: AgentSession, detail: str) -> dict[str, Any]:
    """The fields of a notice about `invitation` (a `team_invitation` or `team_join_request` frame)."""
    return {
        "invitation_id": str(invitation.id),
        "team_id": str(invitation.team_id),
        "team_name": invitation.team.name,
        "lead": lead.label,
        "session": invitation.session.label,
        "name": invitation.name,
        "expires_at": invitation.expires_at.isoformat(),
        "detail": detail,
    }


ASKS_NOTICE = "team_join_request"


def _tell_lead_of_asks(team: Team, *, lead: AgentSession, why: str) -> None:
    """Bring the lead's one notice of the requests to join its team up to date. However many
    sessions ask, the lead has at most one such notice unread, counting the open requests and
    naming the newest: a new ask (`why` empty) rewrites it, or writes it when the last was read;
    a request that closes (`why` says how) rewrites it only while unread, and withdraws it when no
    request is left. So many asker sessions cannot fill the lead's inbox, and, with no cap on the
    requests themselves, cannot keep a genuine teammate from asking: every request stays listed
    (`invitations_visible`) and answerable. The notice's source is the team, the same for every
    asker. Run inside the transaction that opened or closed the request, which holds the team's
    lock (`_lock_team`): one rewrite at a time, so two asks never each leave an unread notice."""
    asks = Invitation.objects.select_related("team", "session").filter(
        team=team, asked_by=Asker.SESSION, state=InvitationState.OPEN, expires_at__gt=timezone.now()
    )
    newest = asks.order_by("-created_at", "-id").first()
    if newest is None:
        notice_withdraw(kind=ASKS_NOTICE, source=team.id, recipient=lead, why=why or "no request open")
        return
    count = asks.count()
    accept = f"POST /api/v1/teams/invitations/{newest.id}/accept"
    listing = (
        "GET /api/v1/teams/invitations (newest first; its `next` is the `?before=` of the next page), "
        "MCP answer_invitation with no id or CLI `switchboard team invitations`"
    )
    add = f"POST /api/v1/teams/{team.id}/members, MCP add_member"
    if count == 1:
        detail = (
            f"{newest.session.label} asks to join your team {team.name!r} as {newest.name}. Add it "
            f"({add}) or {accept}; decline: .../decline."
        )
        summary = f"{newest.session.name} asks to join team {team.name}"
    else:
        detail = (
            f"{count} sessions ask to join your team {team.name!r}, the newest {newest.session.label} "
            f"as {newest.name}; list them with {listing}. Add one ({add}) or accept its invitation "
            "(POST /api/v1/teams/invitations/{id}/accept); decline: .../decline. This notice is "
            "rewritten as requests come and go."
        )
        summary = f"{count} sessions ask to join team {team.name}"
    fields = {"open_requests": count, **_invitation_fields(newest, lead=lead, detail=detail)}
    hub_notify(
        recipient=lead,
        text=frame_text(ASKS_NOTICE, fields),
        summary=summary,
        notice=ASKS_NOTICE,
        source=team.id,
        replace_only=bool(why),
    )


def _lock_team(team: Team) -> bool:
    """Lock the team's row until the transaction ends, before its invitations are written, in the
    order `team_end` takes them (team, then invitations). A no-key lock, so rows that point at the
    team can still be written meanwhile. True while the team is live."""
    ended = Team.objects.select_for_update(no_key=True).filter(pk=team.pk).values_list("ended_at", flat=True)
    return list(ended) == [None]


def invitation_get(*, invitation_id: Any) -> Invitation:
    try:
        return Invitation.objects.select_related("team", "session").get(pk=invitation_id)
    except (Invitation.DoesNotExist, ValueError, Exception) as exc:  # a malformed UUID: ValidationError
        raise NotFound("No such invitation.") from exc


def _is_lead(team: Team, actor: Principal) -> bool:
    return (
        actor.session is not None
        and Membership.objects.filter(
            team=team, session=actor.session, role=Role.LEAD, left_at__isnull=True
        ).exists()
    )


def _require_answerer(invitation: Invitation, actor: Principal) -> None:
    """The side that did not open the invitation answers it (or an operator)."""
    if actor.is_operator:
        return
    session = actor.require_session()
    if invitation.asked_by == Asker.LEAD and session.id == invitation.session_id:
        return
    if invitation.asked_by == Asker.SESSION and _is_lead(invitation.team, actor):
        return
    if session.id == invitation.session_id or _is_lead(invitation.team, actor):
        raise Forbidden("You opened this invitation; the other side answers it.", reason="not_answerer")
    raise NotFound("No such invitation.")


def _require_open(invitation: Invitation) -> None:
    now = timezone.now()
    if invitation.state == InvitationState.OPEN and invitation.expires_at <= now:
        _lapse(Invitation.objects.filter(pk=invitation.pk), now=now)
        invitation.refresh_from_db(fields=["state", "answered_at", "answered_by"])
    if invitation.state != InvitationState.OPEN:
        raise Conflict(
            f"Invitation {invitation.id} is {invitation.state}; nothing changed.", reason="stale_invitation"
        )


def invitation_answer(
    *, invitation_id: Any, actor: Principal, accept: bool
) -> tuple[Invitation, Membership | None]:
    """Accept (the session joins the roster) or decline an open invitation addressed to you."""
    invitation = invitation_get(invitation_id=invitation_id)
    _require_answerer(invitation, actor)
    _require_open(invitation)
    if accept:
        return _accept(invitation, actor=actor, name=None)
    _close(invitation, actor=actor, state=InvitationState.DECLINED)
    return invitation, None


def invitation_cancel(*, invitation_id: Any, actor: Principal) -> Invitation:
    """Withdraw an open invitation you opened (or any, as an operator)."""
    invitation = invitation_get(invitation_id=invitation_id)
    if not actor.is_operator:
        session = actor.require_session()
        mine = (invitation.asked_by == Asker.LEAD and _is_lead(invitation.team, actor)) or (
            invitation.asked_by == Asker.SESSION and session.id == invitation.session_id
        )
        if not mine:
            raise NotFound("No such invitation of yours.")
    _require_open(invitation)
    team_change_bounded(actor=actor)
    _close(invitation, actor=actor, state=InvitationState.CANCELLED)
    return invitation


def _close(invitation: Invitation, *, actor: Principal, state: str) -> None:
    """Move an open invitation to `state` (answered, withdrawn, cancelled with its team, lapsed)
    under its team's lock, audited, its notice withdrawn; the opener hears a decline, and an asker
    that its request was accepted. Conflict when it was closed a moment ago."""
    now = timezone.now()
    with transaction.atomic():
        _lock_team(invitation.team)
        if not Invitation.objects.filter(pk=invitation.pk, state=InvitationState.OPEN).update(
            state=state, answered_at=now, answered_by=actor.actor
        ):
            raise Conflict(
                f"Invitation {invitation.id} was answered a moment ago.", reason="stale_invitation"
            )
        invitation.state, invitation.answered_at, invitation.answered_by = state, now, actor.actor
        audit_event(
            f"team.invitation_{state}",
            actor=actor.actor,
            target=str(invitation.team_id),
            detail={"invitation": str(invitation.id), "session": str(invitation.session_id)},
        )
        _withdraw_notice(invitation, why=f"invitation {state}")
        if state == InvitationState.DECLINED or (
            state == InvitationState.ACCEPTED and invitation.asked_by == Asker.SESSION
        ):
            # The asker is told of these two, so its own request closes with them; nothing else
            # the lead's team does (ending, lapsing) shows in the asker's request.
            JoinRequest.objects.filter(invitation=invitation, state=InvitationState.OPEN).update(
                state=state, answered_at=now
            )
            _tell_opener(invitation)


def invitations_expire_due(*, now: Any = None, batch: int = 500) -> int:
    """Close open invitations past their expiry (the teams sweep). Returns how many."""
    return _lapse(Invitation.objects.all(), now=now or timezone.now(), batch=batch)


def _lapse(invitations: QuerySet[Invitation], *, now: Any, batch: int = 500) -> int:
    """Close the open invitations among `invitations` past their expiry as `expired`, with what
    closing takes along (`_close`: the unread notice asking for an answer is withdrawn). The one
    way an invitation lapses, whether the sweep finds it first or an answer or a new invitation
    does. Returns how many it closed."""
    due = invitations.filter(expires_at__lte=now)
    return _close_open(due, actor=HUB, state=InvitationState.EXPIRED, batch=batch)


def invitations_cancel_for_team(*, team: Team, actor: Principal) -> int:
    """Cancel the open invitations of a team that is ending, withdrawing their unread notices: an
    invitation stands only while its team is live. Run by `team_end` in its transaction, before
    the roster closes. Returns how many were cancelled."""
    # The lead's notice of the requests to join goes first, so closing each below rewrites nothing.
    notice_withdraw(kind=ASKS_NOTICE, source=team.id, recipient=_lead_of(team), why="team ended")
    return _close_open(Invitation.objects.filter(team=team), actor=actor, state=InvitationState.CANCELLED)


def _close_open(
    invitations: QuerySet[Invitation], *, actor: Principal, state: str, batch: int | None = None
) -> int:
    """`_close` each invitation among `invitations` still open (the first `batch` to expire);
    one answered meanwhile is left as it is. Returns how many it closed."""
    still_open = invitations.select_related("team", "session").filter(state=InvitationState.OPEN)
    closed = 0
    for invitation in still_open.order_by("expires_at")[:batch]:
        try:
            _close(invitation, actor=actor, state=state)
        except Conflict:
            continue  # answered a moment ago
        closed += 1
    return closed


def _withdraw_notice(invitation: Invitation, *, why: str) -> None:
    """An invitation that no longer stands leaves no unread notice asking for an answer: the
    session's is withdrawn; the lead's notice of the requests to join is rewritten without it."""
    if invitation.asked_by == Asker.LEAD:
        notice_withdraw(
            kind="team_invitation",
            source=invitation.team.lead_session_id,
            recipient=invitation.session,
            why=why,
        )
    else:
        _tell_lead_of_asks(invitation.team, lead=_lead_of(invitation.team), why=why)


def _tell_opener(invitation: Invitation) -> None:
    """The side that opened the invitation hears a decline, and a session that asked hears it joined."""
    team, session = invitation.team, invitation.session
    if invitation.asked_by == Asker.LEAD:
        recipient, source = _lead_of(team), session.id
        text = f"{session.label} {invitation.state} your invitation to team {team.name!r}."
    else:
        recipient, source = session, team.id
        # The team's name is for its members: a declined asker hears only who answered.
        if invitation.state == InvitationState.ACCEPTED:
            text = f"The lead of team {team.name!r} accepted your request to join it."
        else:
            text = f"{_lead_of(team).label} {invitation.state} your request to join its team."
    hub_notify(
        recipient=recipient,
        text=text,
        summary=text[:200],
        notice="team_invitation_answer",
        source=source,
    )


def _accept(
    invitation: Invitation, *, actor: Principal, name: str | None
) -> tuple[Invitation, Membership | None]:
    # The invited session's own standing (on another roster, an observer) is checked here, at its
    # yes, not when the lead invited it (`roster_check_invitable`); a refusal leaves it open.
    roster_check_joinable(team=invitation.team, session=invitation.session, name=name or invitation.name)
    with transaction.atomic():
        _close(invitation, actor=actor, state=InvitationState.ACCEPTED)
        member = roster_join(
            team=invitation.team, session=invitation.session, actor=actor, name=name or invitation.name
        )
    return invitation, member


# How many invitations one page of `invitations_visible` holds.
INVITATIONS_PAGE = 200


def invitations_visible(*, actor: Principal, before: Any = None) -> tuple[list[Invitation], str | None]:
    """Open invitations: to or from the calling session and the team it leads; all for an operator.
    Newest first, a page at a time: `before` (the `next` of the page before) goes on after that
    invitation, so every open request to join a lead's team is listed however many sessions ask.
    Returns the page and the `before` of the next one (None on the last)."""
    now = timezone.now()
    qs = Invitation.objects.select_related("team", "session")
    if not actor.is_operator:
        session = actor.require_session()
        led = Membership.objects.filter(session=session, role=Role.LEAD, left_at__isnull=True).values(
            "team_id"
        )
        # A session's own unanswered request to join is not shown here: it would tell the asker
        # that the session it asked leads a team, and which. It lists its `JoinRequest`s instead
        # (`join_requests_of`), which say whom it asked and nothing of a team.
        qs = qs.filter(session=session, asked_by=Asker.LEAD) | qs.filter(team_id__in=led)
    page = qs.filter(state=InvitationState.OPEN, expires_at__gt=now)
    if before is not None:
        # Any state: the invitation a page ended on may have been answered since.
        mark = qs.filter(pk=before).values("created_at", "id").first()
        if mark is None:
            raise NotFound("No such invitation.")
        page = page.filter(
            Q(created_at__lt=mark["created_at"]) | Q(created_at=mark["created_at"], id__lt=mark["id"])
        )
    rows = list(page.order_by("-created_at", "-id")[: INVITATIONS_PAGE + 1])
    more = len(rows) > INVITATIONS_PAGE
    return rows[:INVITATIONS_PAGE], (str(rows[INVITATIONS_PAGE - 1].id) if more else None)


def invitation_summary(invitation: Invitation) -> dict[str, Any]:
    """An invitation as the API shows it; `answer_by` says which side accepts or declines."""
    return {
        "id": str(invitation.id),
        "team_id": str(invitation.team_id),
        "team_name": invitation.team.name,
        "session": str(invitation.session_id),
        "session_label": invitation.session.label,
        "name": invitation.name,
        "asked_by": invitation.asked_by,
        "answer_by": "session" if invitation.asked_by == Asker.LEAD else "lead",
        "state": invitation.state,
        "created_at": invitation.created_at.isoformat() if invitation.created_at else None,
        "expires_at": invitation.expires_at.isoformat() if invitation.expires_at else None,
        "answered_at": invitation.answered_at.isoformat() if invitation.answered_at else None,
    }
