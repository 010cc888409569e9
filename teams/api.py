"""REST endpoints for teams, the task board, frames, idle subscriptions, gates and observers.

Mounted under /api/v1/. A session token acts as that session; an operator sees every team and may
do what a lead may (end a team, set gates, assign) but never sends frames as a member.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from messaging.auth import AUTH, principal
from messaging.errors import Forbidden, NotFound
from messaging.models import AgentSession, SessionStatus
from messaging.principals import Principal
from messaging.services.pipeline import message_send
from messaging.services.recipients import resolve_recipient
from messaging.services.request import SendRequest
from messaging.services.sending import SendOutcome
from teams.models import GateEvent, Observer, Team
from teams.selectors import (
    gate_checks_of_team,
    requests_of_team,
    subscriptions_of,
    tasks_of_team,
    teams_visible,
)
from teams.services.frames import (
    FrameResult,
    frame_drop,
    frame_send,
    request_get,
    request_summaries,
    request_summary,
)
from teams.services.gates import check_summary, gate_remove, gate_set, gate_summary
from teams.services.invitations import (
    invitation_answer,
    invitation_cancel,
    invitation_summary,
    invitations_visible,
    join_request_summary,
    join_request_withdraw,
    join_requests_of,
    team_ask_to_join,
    team_invite,
)
from teams.services.observers import (
    observer_register,
    observer_report,
    observer_summary,
    observer_unregister,
)
from teams.services.shutdown import shutdown_request, shutdown_respond
from teams.services.subscriptions import subscription_cancel, subscription_create, subscription_summary
from teams.services.tasks import (
    task_assign,
    task_claim,
    task_claim_next,
    task_complete,
    task_create,
    task_get_visible,
    task_link,
    task_release,
    task_summary,
)
from teams.services.teams import (
    live_membership,
    member_leave,
    member_require_lead,
    member_require_live,
    member_summary,
    team_create,
    team_end,
    team_get,
    team_get_visible,
    team_summary,
)
from teams.services.watchers import watcher_allow, watcher_revoke, watcher_summary, watchers_visible

router = Router(tags=["teams"])


class ErrorOut(Schema):
    error: str
    detail: str


ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class TeamIn(Schema):
    name: str = ""


class MemberIn(Schema):
    session: str = Field(..., description="The session to add: id, ref, or `name [ref]`.")
    name: str | None = Field(None, description="Its name on this roster (default: the session's name).")


class TeamMessageIn(Schema):
    to_member: uuid.UUID = Field(..., description="A member id from the roster (not a name).")
    message: str
    summary: str = ""
    priority: Literal["normal", "urgent"] = "normal"


class FrameIn(Schema):
    type: str = Field(..., description="shutdown_request, shutdown_response, plan_approval_request, ...")
    to_member: uuid.UUID | None = Field(
        None, description="Recipient member id (teammates' requests go to the lead)."
    )
    request_id: uuid.UUID | None = Field(
        None, description="For *_response frames: the open request answered."
    )
    approve: bool | None = None
    reason: str = ""
    body: dict[str, Any] = Field(default_factory=dict)


class ShutdownIn(Schema):
    reason: str = ""


class RespondIn(Schema):
    approve: bool
    reason: str = ""
    body: dict[str, Any] = Field(default_factory=dict)


class TaskIn(Schema):
    title: str
    description: str = ""
    blocked_by: list[int] = Field(default_factory=list)


class TaskPatch(Schema):
    add_blocked_by: list[int] = Field(default_factory=list)
    remove_blocked_by: list[int] = Field(default_factory=list)


class ClaimIn(Schema):
    expected_revision: int | None = None


class AssignIn(Schema):
    member_id: uuid.UUID


class CompleteIn(Schema):
    result: str = ""


class GateIn(Schema):
    url: str
    timeout_seconds: float = 5.0
    max_attempts: int = 3
    fail_closed: bool = False


class JoinIn(Schema):
    lead: str = Field(..., description="The lead of the team to join: id, ref, name or `name [ref]`.")
    name: str | None = Field(None, description="Your name on its roster (default: your session's name).")


class WatcherIn(Schema):
    watcher: str = Field(..., description="The session allowed to read the final answers: id, ref or name.")
    target: str | None = Field(
        None, description="Operators only: whose final answers (default: the calling session's)."
    )


class SubscribeIn(Schema):
    target: str = Field(..., description="The session to wait for: id, ref, name or `name [ref]`.")


class ObserverIn(Schema):
    session: str | None = Field(
        None, description="Operators only: the session to register (default: yourself)."
    )
    target_session: str | None = None
    target_team: uuid.UUID | None = None


class ReportIn(Schema):
    message: str
    summary: str = ""


def _session_by_address(caller: Principal, address: str) -> AgentSession:
    """A session named by id, ref, name or `name [ref]` (resolved like a send, without sending)."""
    if caller.session is not None:
        recipient, _ = resolve_recipient(caller.session, address)
        return recipient
    try:
        return AgentSession.objects.exclude(status=SessionStatus.EXITED).get(pk=uuid.UUID(address))
    except (ValueError, AgentSession.DoesNotExist):
        pass
    found = AgentSession.objects.exclude(status=SessionStatus.EXITED).filter(ref=address.lower()).first()
    if found is None:
        raise NotFound(
            f"No live session with id or ref {address!r} (operators address sessions by id or ref)."
        )
    return found


def _sent(outcome: SendOutcome | None) -> dict[str, Any] | None:
    return outcome.as_dict() if outcome is not None else None


def _frame_out(result: FrameResult, caller: Principal) -> dict[str, Any]:
    return {
        "type": result.frame_type,
        "message": _sent(result.outcome),
        "request": request_summary(result.request, viewer=caller) if result.request else None,
        "repeated": result.outcome is None and result.request is not None,
    }


def _visible_team(request: HttpRequest, team_id: uuid.UUID) -> tuple[Principal, Team]:
    """The caller and the team its path names, when the caller reads that team (`team_get_visible`):
    every `/teams/{team_id}` route starts here."""
    caller = principal(request)
    return caller, team_get_visible(team_id=team_id, actor=caller)


def _frame_team(request: HttpRequest, team_id: uuid.UUID, frame_type: str) -> tuple[Principal, Team]:
    """`_visible_team` for a route that sends a frame: a frame to a team the caller does not read
    is refused with the same 404 as any other call there, and audited as every refused frame is."""
    caller = principal(request)
    try:
        return caller, team_get_visible(team_id=team_id, actor=caller)
    except NotFound as exc:
        detail = f"team {team_id}: {exc.detail}"
        frame_drop(actor=caller, team=None, frame_type=frame_type, why="not_a_member", detail=detail)
        raise


# --- teams and roster -----------------------------------------------------------------------------


@router.post("/teams", response={201: dict, **ERRORS}, auth=AUTH)
def create_team(request: HttpRequest, body: TeamIn) -> Status:
    """Create a team led by the calling session (a session leads at most one; teammates none)."""
    caller = principal(request)
    team = team_create(lead=caller.require_session(), name=body.name, actor=caller)
    return Status(201, team_summary(team))


@router.get("/teams", response={200: dict, **ERRORS}, auth=AUTH)
def list_teams(request: HttpRequest, include_ended: bool = False) -> dict[str, Any]:
    """Teams you are on (operators: every team)."""
    caller = principal(request)
    return {"teams": [team_summary(t) for t in teams_visible(viewer=caller, include_ended=include_ended)]}


@router.get("/teams/mine", response={200: dict, **ERRORS}, auth=AUTH)
def my_team(request: HttpRequest) -> dict[str, Any]:
    """The live team you are on and your member id, or nulls."""
    session = principal(request).require_session()
    member = live_membership(session)
    if member is None:
        return {"team": None, "member": None}
    return {"team": team_summary(member.team), "member": member_summary(member)}


# Registered before /teams/{team_id} so these fixed paths are never read as a team id.
def _joined(invitation: Any, member: Any) -> Status:
    """201 with the member when the session is on the roster now; 202 with the open invitation."""
    if member is not None:
        body = member_summary(member)
        body["invitation"] = invitation_summary(invitation) if invitation is not None else None
        return Status(201, body)
    body = {"member_id": None, "invitation": invitation_summary(invitation)}
    side = "the session" if invitation.asked_by == "lead" else "the lead"
    body["detail"] = f"Invitation {invitation.id} is open; {side} accepts or declines it."
    return Status(202, body)


@router.post("/teams/join", response={201: dict, 202: dict, **ERRORS}, auth=AUTH)
def join_team(request: HttpRequest, body: JoinIn) -> Status:
    """Ask to join the team `lead` leads: you join now if it invited you, else it is asked (202,
    your request to join)."""
    caller = principal(request)
    lead = _session_by_address(caller, body.lead)
    asked, member = team_ask_to_join(lead=lead, actor=caller, name=body.name)
    if member is not None:
        return _joined(None, member)
    assert asked is not None
    # The same answer whether or not `lead` leads a team: who leads what is its members' to know.
    return Status(
        202,
        {
            "member_id": None,
            "invitation": None,
            "request": join_request_summary(asked),
            "detail": (
                f"No invitation for you from {lead.label}: asked it to add you to the team it "
                "leads, if it leads one. You are told when its lead adds you or declines; "
                "the request lapses unanswered after a while. Nothing else is said of the team. "
                f"Withdraw it: DELETE /api/v1/teams/join/{asked.id}."
            ),
        },
    )


@router.get("/teams/join", response={200: dict, **ERRORS}, auth=AUTH)
def list_join_requests(request: HttpRequest) -> dict[str, Any]:
    """Your own open requests to join: whom you asked (nothing of any team)."""
    return {"requests": [join_request_summary(r) for r in join_requests_of(actor=principal(request))]}


@router.delete("/teams/join/{uuid:request_id}", response={200: dict, **ERRORS}, auth=AUTH)
def withdraw_join_request(request: HttpRequest, request_id: uuid.UUID) -> dict[str, Any]:
    """Withdraw your own open request to join (only its asker may)."""
    return join_request_summary(join_request_withdraw(request_id=request_id, actor=principal(request)))


@router.get("/teams/invitations", response={200: dict, **ERRORS}, auth=AUTH)
def list_invitations(request: HttpRequest, before: uuid.UUID | None = None) -> dict[str, Any]:
    """Open invitations to you, from you and your team (operators: all open ones), newest first, a
    page at a time: `next` is the `before` of the next page (null on the last)."""
    page, following = invitations_visible(actor=principal(request), before=before)
    return {"invitations": [invitation_summary(i) for i in page], "next": following}


@router.post("/teams/invitations/{uuid:invitation_id}/accept", response={201: dict, **ERRORS}, auth=AUTH)
def accept_invitation(request: HttpRequest, invitation_id: uuid.UUID) -> Status:
    """Accept an invitation addressed to you: the session joins the roster (201, its member)."""
    return _joined(*invitation_answer(invitation_id=invitation_id, actor=principal(request), accept=True))


@router.post("/teams/invitations/{uuid:invitation_id}/decline", response={200: dict, **ERRORS}, auth=AUTH)
def decline_invitation(request: HttpRequest, invitation_id: uuid.UUID) -> dict[str, Any]:
    """Decline an invitation addressed to you; nothing else changes."""
    invitation, _ = invitation_answer(invitation_id=invitation_id, actor=principal(request), accept=False)
    return invitation_summary(invitation)


@router.delete("/teams/invitations/{uuid:invitation_id}", response={200: dict, **ERRORS}, auth=AUTH)
def cancel_invitation(request: HttpRequest, invitation_id: uuid.UUID) -> dict[str, Any]:
    """Withdraw an open invitation you opened."""
    return invitation_summary(invitation_cancel(invitation_id=invitation_id, actor=principal(request)))


@router.post("/teams/watchers", response={201: dict, **ERRORS}, auth=AUTH)
def allow_watcher(request: HttpRequest, body: WatcherIn) -> Status:
    """Let a session read your final answers in its notify-when-idle notices (operators: anyone's)."""
    caller = principal(request)
    if body.target is not None:
        caller.require_operator()
        target = _session_by_address(caller, body.target)
    else:
        target = caller.require_session()
    watcher = _session_by_address(caller, body.watcher)
    return Status(201, watcher_summary(watcher_allow(target=target, watcher=watcher, actor=caller)))


@router.get("/teams/watchers", response={200: dict, **ERRORS}, auth=AUTH)
def list_watchers(request: HttpRequest) -> dict[str, Any]:
    """Who may read your final answers (operators: every grant)."""
    return {"watchers": [watcher_summary(w) for w in watchers_visible(actor=principal(request))]}


@router.delete("/teams/watchers/{int:grant_id}", response={200: dict, **ERRORS}, auth=AUTH)
def revoke_watcher(request: HttpRequest, grant_id: int) -> dict[str, Any]:
    """Withdraw a watcher grant (the session that made it, or an operator)."""
    return watcher_summary(watcher_revoke(grant_id=grant_id, actor=principal(request)))


@router.post("/teams/subscriptions", response={201: dict, **ERRORS}, auth=AUTH)
def subscribe(request: HttpRequest, body: SubscribeIn) -> Status:
    """notify_when_idle: be told once at the target's next idle or exit (at once if idle now; 12 h)."""
    caller = principal(request)
    subscriber = caller.require_session()
    target = _session_by_address(caller, body.target)
    return Status(
        201, subscription_summary(subscription_create(subscriber=subscriber, target=target, actor=caller))
    )


@router.get("/teams/subscriptions", response={200: dict, **ERRORS}, auth=AUTH)
def list_subscriptions(request: HttpRequest) -> dict[str, Any]:
    """Your notify-when-idle subscriptions, newest first."""
    session = principal(request).require_session()
    return {"subscriptions": [subscription_summary(s) for s in subscriptions_of(session=session)]}


@router.delete("/teams/subscriptions/{int:subscription_id}", response={200: dict, **ERRORS}, auth=AUTH)
def unsubscribe(request: HttpRequest, subscription_id: int) -> dict[str, Any]:
    """Withdraw a waiting subscription."""
    return subscription_summary(
        subscription_cancel(subscription_id=subscription_id, actor=principal(request))
    )


@router.post("/teams/observers", response={201: dict, **ERRORS}, auth=AUTH)
def register_observer(request: HttpRequest, body: ObserverIn) -> Status:
    """Register a session (yourself, or any as an operator) as the observer of one session or team."""
    caller = principal(request)
    if body.session is not None:
        caller.require_operator()
        session = _session_by_address(caller, body.session)
    else:
        session = caller.require_session()
    target_session = _session_by_address(caller, body.target_session) if body.target_session else None
    target_team = team_get(team_id=body.target_team) if body.target_team else None
    observer = observer_register(
        session=session, actor=caller, target_session=target_session, target_team=target_team
    )
    return Status(201, observer_summary(observer))


@router.delete("/teams/observers/{uuid:session_id}", response={200: dict, **ERRORS}, auth=AUTH)
def unregister_observer(request: HttpRequest, session_id: uuid.UUID) -> dict[str, Any]:
    """Operators: lift a session's observer restriction."""
    caller = principal(request)
    caller.require_operator()
    session = AgentSession.objects.filter(pk=session_id).first()
    if session is None:
        raise NotFound("No such session.")
    observer_unregister(session=session, actor=caller)
    return {"session": str(session.id), "observer": False}


@router.post("/teams/observers/report", response={201: dict, **ERRORS}, auth=AUTH)
def send_report(request: HttpRequest, body: ReportIn) -> Status:
    """An observer's one-way report to its target (marked KIND=observer_report TRUST=observer-report)."""
    caller = principal(request)
    outcome = observer_report(
        session=caller.require_session(), actor=caller, text=body.message, summary=body.summary
    )
    return Status(201, _sent(outcome))


@router.get("/teams/observers", response={200: dict, **ERRORS}, auth=AUTH)
def list_observers(request: HttpRequest) -> dict[str, Any]:
    """Operators: every observer registration."""
    principal(request).require_operator()
    return {"observers": [observer_summary(o) for o in Observer.objects.order_by("created_at")[:500]]}


@router.get("/teams/{team_id}", response={200: dict, **ERRORS}, auth=AUTH)
def team_detail(request: HttpRequest, team_id: uuid.UUID, include_left: bool = False) -> dict[str, Any]:
    """A team and its roster, with each member's liveness (busy / idle / dead / stopped)."""
    _, team = _visible_team(request, team_id)
    return team_summary(team, include_left=include_left)


@router.post("/teams/{team_id}/end", response={200: dict, **ERRORS}, auth=AUTH)
def end_team(request: HttpRequest, team_id: uuid.UUID) -> dict[str, Any]:
    """End the team (lead or operator). Its tasks and history stay, read-only."""
    caller, team = _visible_team(request, team_id)
    team = team_end(team=team, actor=caller)
    return team_summary(team, include_left=True)


@router.post("/teams/{team_id}/members", response={201: dict, 202: dict, **ERRORS}, auth=AUTH)
def add_member(request: HttpRequest, team_id: uuid.UUID, body: MemberIn) -> Status:
    """Operators add a session at once (201, its member). A lead invites it (202, the invitation):
    it joins when it accepts, or at once (201) if it had asked to join this team."""
    caller, team = _visible_team(request, team_id)
    member_require_lead(team=team, actor=caller)
    session = _session_by_address(caller, body.session)
    return _joined(*team_invite(team=team, session=session, actor=caller, name=body.name))


@router.delete("/teams/{team_id}/members/{member_id}", response={200: dict, **ERRORS}, auth=AUTH)
def remove_member(request: HttpRequest, team_id: uuid.UUID, member_id: uuid.UUID) -> dict[str, Any]:
    """Leave the team (yourself), or take a teammate off it (lead, operator)."""
    caller, team = _visible_team(request, team_id)
    member = member_require_live(team=team, member_id=member_id)
    return member_summary(member_leave(member=member, actor=caller))


@router.post(
    "/teams/{team_id}/messages", response={201: dict, **ERRORS, 413: ErrorOut, 429: ErrorOut}, auth=AUTH
)
def team_message(request: HttpRequest, team_id: uuid.UUID, body: TeamMessageIn) -> Status:
    """A plain message to a member by member id: refused if that member has left the roster, so a
    reused name never reaches a different teammate."""
    caller, team = _visible_team(request, team_id)
    session = caller.require_session()
    sender = live_membership(session)
    if sender is None or sender.team_id != team.id:
        raise Forbidden("You are not on this team's roster.")
    member = member_require_live(team=team, member_id=body.to_member)
    outcome = message_send(
        SendRequest(
            sender=session,
            to=str(member.session_id),
            text=body.message,
            summary=body.summary,
            priority=body.priority,
            actor=caller,
        )
    )
    return Status(201, _sent(outcome))


@router.post(
    "/teams/{team_id}/frames", response={201: dict, **ERRORS, 413: ErrorOut, 429: ErrorOut}, auth=AUTH
)
def send_frame(request: HttpRequest, team_id: uuid.UUID, body: FrameIn) -> Status:
    """Send a structured frame (role-checked; responses must match an open request)."""
    caller, team = _frame_team(request, team_id, body.type)
    result = frame_send(
        team=team,
        actor=caller,
        frame_type=body.type,
        to_member=body.to_member,
        request_id=body.request_id,
        approve=body.approve,
        reason=body.reason,
        body=body.body,
    )
    return Status(201, _frame_out(result, caller))


@router.get("/teams/{team_id}/requests", response={200: dict, **ERRORS}, auth=AUTH)
def list_requests(request: HttpRequest, team_id: uuid.UUID, state: str | None = None) -> dict[str, Any]:
    """Protocol requests (shutdown, plan approval, permission) and their state; their text only to
    whoever may read the frame that carried it (teams.services.frames.request_summaries)."""
    caller, team = _visible_team(request, team_id)
    return {"requests": request_summaries(requests_of_team(team=team, state=state), viewer=caller)}


@router.post("/teams/{team_id}/requests/{request_id}/respond", response={201: dict, **ERRORS}, auth=AUTH)
def respond(request: HttpRequest, team_id: uuid.UUID, request_id: uuid.UUID, body: RespondIn) -> Status:
    """Answer an open request addressed to you: approve, or reject with a reason."""
    caller, team = _visible_team(request, team_id)
    found = request_get(team=team, request_id=request_id)
    result = frame_send(
        team=team,
        actor=caller,
        frame_type=f"{found.kind}_response",
        request_id=request_id,
        approve=body.approve,
        reason=body.reason,
        body=body.body,
    )
    return Status(201, _frame_out(result, caller))


@router.post("/teams/{team_id}/members/{member_id}/shutdown", response={201: dict, **ERRORS}, auth=AUTH)
def ask_shutdown(request: HttpRequest, team_id: uuid.UUID, member_id: uuid.UUID, body: ShutdownIn) -> Status:
    """The lead asks a teammate to shut down (asking again returns the open request)."""
    caller, team = _frame_team(request, team_id, "shutdown_request")
    return Status(
        201,
        _frame_out(
            shutdown_request(team=team, actor=caller, to_member=member_id, reason=body.reason), caller
        ),
    )


@router.post("/teams/{team_id}/shutdown/{request_id}", response={201: dict, **ERRORS}, auth=AUTH)
def answer_shutdown(
    request: HttpRequest, team_id: uuid.UUID, request_id: uuid.UUID, body: RespondIn
) -> Status:
    """The teammate answers a shutdown request: approve (it stops) or reject with a reason."""
    caller, team = _frame_team(request, team_id, "shutdown_response")
    result = shutdown_respond(
        team=team, actor=caller, request_id=request_id, approve=body.approve, reason=body.reason
    )
    return Status(201, _frame_out(result, caller))


@router.get("/teams/{team_id}/gates", response={200: dict, **ERRORS}, auth=AUTH)
def list_gates(request: HttpRequest, team_id: uuid.UUID) -> dict[str, Any]:
    """The team's quality gates and recent checks."""
    _, team = _visible_team(request, team_id)
    return {
        "gates": [gate_summary(g) for g in team.gates.order_by("event")],
        "checks": [check_summary(c) for c in gate_checks_of_team(team=team)],
    }


@router.put("/teams/{team_id}/gates/{event}", response={200: dict, **ERRORS}, auth=AUTH)
def put_gate(
    request: HttpRequest,
    team_id: uuid.UUID,
    event: Literal["task_created", "task_completed", "teammate_idle"],
    body: GateIn,
) -> dict[str, Any]:
    """Install the team's HTTP hook for one event (lead or operator)."""
    caller, team = _visible_team(request, team_id)
    gate = gate_set(
        team=team,
        event=GateEvent(event),
        url=body.url,
        actor=caller,
        timeout_seconds=body.timeout_seconds,
        max_attempts=body.max_attempts,
        fail_closed=body.fail_closed,
    )
    return gate_summary(gate)


@router.delete("/teams/{team_id}/gates/{event}", response={200: dict, **ERRORS}, auth=AUTH)
def delete_gate(request: HttpRequest, team_id: uuid.UUID, event: str) -> dict[str, Any]:
    """Remove the team's hook for one event (lead or operator)."""
    caller, team = _visible_team(request, team_id)
    return {"removed": gate_remove(team=team, event=event, actor=caller)}


# --- the task board -------------------------------------------------------------------------------


@router.post("/teams/{team_id}/tasks", response={201: dict, **ERRORS}, auth=AUTH)
def create_task(request: HttpRequest, team_id: uuid.UUID, body: TaskIn) -> Status:
    """Put a task on the board (any member or an operator), optionally blocked by others."""
    caller, team = _visible_team(request, team_id)
    task = task_create(
        team=team,
        actor=caller,
        title=body.title,
        description=body.description,
        blocked_by=body.blocked_by,
    )
    return Status(201, task_summary(task))


@router.get("/teams/{team_id}/tasks", response={200: dict, **ERRORS}, auth=AUTH)
def list_tasks(
    request: HttpRequest, team_id: uuid.UUID, status: str | None = None, owner: uuid.UUID | None = None
) -> dict[str, Any]:
    """The team's board (filter by status or owner member id)."""
    _, team = _visible_team(request, team_id)
    return {"tasks": [task_summary(t) for t in tasks_of_team(team=team, status=status, owner=owner)]}


@router.post("/tasks/claim-next", response={200: dict, **ERRORS}, auth=AUTH)
def claim_next(request: HttpRequest) -> dict[str, Any]:
    """Claim the next unblocked task on your team's board (`task` is null when there is none)."""
    caller = principal(request)
    member = live_membership(caller.require_session())
    if member is None:
        raise Forbidden("You are not on any team's roster.")
    task = task_claim_next(team=member.team, actor=caller)
    return {"task": task_summary(task) if task else None}


def _visible_task(request: HttpRequest, task_id: int) -> tuple[Principal, Any]:
    caller = principal(request)
    return caller, task_get_visible(task_id=task_id, actor=caller)


@router.get("/tasks/{task_id}", response={200: dict, **ERRORS}, auth=AUTH)
def task_detail(request: HttpRequest, task_id: int) -> dict[str, Any]:
    """One task: status, owner, blockers, revision, gate state."""
    _, task = _visible_task(request, task_id)
    return task_summary(task)


@router.patch("/tasks/{task_id}", response={200: dict, **ERRORS}, auth=AUTH)
def link_task(request: HttpRequest, task_id: int, body: TaskPatch) -> dict[str, Any]:
    """Add or remove `blocked_by` edges (a cycle is refused)."""
    caller, task = _visible_task(request, task_id)
    return task_summary(
        task_link(task=task, actor=caller, add=body.add_blocked_by, remove=body.remove_blocked_by)
    )


@router.post("/tasks/{task_id}/claim", response={200: dict, **ERRORS}, auth=AUTH)
def claim(request: HttpRequest, task_id: int, body: ClaimIn) -> dict[str, Any]:
    """Claim one task (atomic: one winner; 409 `not_claimable` for the others)."""
    caller, task = _visible_task(request, task_id)
    return task_summary(task_claim(task=task, actor=caller, expected_revision=body.expected_revision))


@router.post("/tasks/{task_id}/assign", response={200: dict, **ERRORS}, auth=AUTH)
def assign(request: HttpRequest, task_id: int, body: AssignIn) -> dict[str, Any]:
    """The lead assigns a task to a member (who gets a `task_assignment` frame)."""
    caller, task = _visible_task(request, task_id)
    return task_summary(task_assign(task=task, member_id=body.member_id, actor=caller))


@router.post("/tasks/{task_id}/complete", response={200: dict, **ERRORS}, auth=AUTH)
def complete(request: HttpRequest, task_id: int, body: CompleteIn) -> dict[str, Any]:
    """Complete your task. With a task_completed gate, `gate_pending` shows it awaits the hook."""
    caller, task = _visible_task(request, task_id)
    return task_summary(task_complete(task=task, actor=caller, result=body.result))


@router.post("/tasks/{task_id}/release", response={200: dict, **ERRORS}, auth=AUTH)
def release(request: HttpRequest, task_id: int) -> dict[str, Any]:
    """Put your unfinished task back on the board, unowned."""
    caller, task = _visible_task(request, task_id)
    return task_summary(task_release(task=task, actor=caller))
