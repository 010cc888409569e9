"""Idle: what a session's turn ending causes for its team (the `dead` rule is `messaging.liveness`).

`session_set_status` calls `on_session_status` inside its transaction, so what a status change
causes here (the idle notification to the lead, fired subscriptions, leaving the roster on exit)
commits or rolls back with the change itself: a final answer is never lost between the two.
"""

from __future__ import annotations

from django.utils import timezone

from messaging.models import AgentSession, MessageKind, SessionStatus
from messaging.principals import HUB, Principal
from teams.models import GateEvent, Membership, Role
from teams.services.notify import clip, frame_text, hub_notify, notify_safely


def on_session_status(
    *, session: AgentSession, previous: str, final_answer: str | None, actor: Principal
) -> None:
    """React to a status change: idle → tell the lead and the subscribers; exit → leave the team."""
    from teams.services.subscriptions import subscriptions_fire

    status = session.status
    if status == SessionStatus.IDLE and (previous != SessionStatus.IDLE or final_answer is not None):
        member = _live_member(session)
        if member is not None and member.role == Role.TEAMMATE:
            teammate_went_idle(member=member, final_answer=session.final_answer, actor=actor)
        subscriptions_fire(target=session, on="idle")
    elif status == SessionStatus.EXITED and previous != SessionStatus.EXITED:
        subscriptions_fire(target=session, on="exited")
        _leave_on_exit(session, actor)


def _live_member(session: AgentSession) -> Membership | None:
    return (
        Membership.objects.select_related("team", "session")
        .filter(session=session, left_at__isnull=True, team__ended_at__isnull=True)
        .first()
    )


def teammate_went_idle(*, member: Membership, final_answer: str, actor: Principal) -> None:
    """A teammate's turn ended: the lead gets its final answer, after the team's idle gate if any."""
    from teams.services.gates import gate_check_open, gate_for

    gate = gate_for(team=member.team, event=GateEvent.TEAMMATE_IDLE)
    if gate is not None:
        gate_check_open(gate=gate, member=member, payload={"final_answer": final_answer})
        return
    idle_notify_lead(member=member, final_answer=final_answer, actor=actor)


def idle_notify_lead(*, member: Membership, final_answer: str, actor: Principal = HUB) -> None:
    """Write the `idle_notification` frame (with the final answer) to the teammate's lead."""
    from teams.models import Task, TaskStatus

    lead = Membership.objects.select_related("session").filter(
        team_id=member.team_id, role=Role.LEAD, left_at__isnull=True
    )
    lead_member = lead.first()
    if lead_member is None:
        return
    answer, truncated = clip(final_answer or "")
    open_tasks = list(
        Task.objects.filter(owner=member, status=TaskStatus.IN_PROGRESS).values_list("id", flat=True)[:50]
    )
    notify_safely(
        sender=member.session,
        recipient=lead_member.session,
        text=frame_text(
            "idle_notification",
            {
                "team_id": str(member.team_id),
                "from_member": str(member.id),
                "from_name": member.name,
                "final_answer": answer,
                "truncated": truncated,
                "tasks_in_progress": open_tasks,
                "idle_at": timezone.now().isoformat(),
            },
        ),
        summary=f"{member.name} is idle" + (f": {answer[:120]}" if answer else ""),
        kind=MessageKind.FRAME,
        frame_type="idle_notification",
        actor=actor,
        # One unread idle notification per teammate: a newer one replaces it (see notify.py).
        notice="idle_notification",
    )


def _leave_on_exit(session: AgentSession, actor: Principal) -> None:
    from teams.services.teams import member_leave, team_end

    member = _live_member(session)
    if member is None:
        return
    if member.role == Role.LEAD:
        team_end(team=member.team, actor=HUB, why="lead exited")
        return
    member_leave(member=member, actor=HUB, why="exited")
    lead = (
        Membership.objects.select_related("session")
        .filter(team_id=member.team_id, role=Role.LEAD, left_at__isnull=True)
        .first()
    )
    if lead is not None:
        hub_notify(
            recipient=lead.session,
            text=f"Teammate {member.name} ({member.id}) exited and left the roster; its unfinished tasks "
            "are back on the board.",
            summary=f"{member.name} exited",
        )
