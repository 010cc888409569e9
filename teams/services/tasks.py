"""The shared task board: create, link, claim (atomic), assign, complete, release.

Every change is a conditional UPDATE on the row's current status and revision, so two claimers
never both win: the database lets exactly one UPDATE match, the other sees 0 rows and moves on.
That holds on PostgreSQL (row lock, then the WHERE is re-checked) and on SQLite (writers queue).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Exists, F, OuterRef, Q, QuerySet, Value, When
from django.utils import timezone

from messaging.errors import Conflict, Forbidden, Invalid, NotFound
from messaging.principals import Principal
from messaging.sensitivity import secrets_in
from messaging.services.audit import audit_event
from messaging.services.events import announce
from teams.models import GateEvent, Membership, Role, Task, TaskEdge, TaskStatus, Team
from teams.services.notify import frame_deliver, frame_text, hub_notify
from teams.services.teams import (
    member_of_caller,
    member_require_lead,
    member_require_live,
    team_require_visible,
)

TITLE_MAX = 200
DESCRIPTION_MAX = 20_000
MAX_BLOCKERS = 100
CLAIM_NEXT_TRIES = 50


def _unfinished_blockers(task_ref: Any) -> QuerySet[TaskEdge]:
    return TaskEdge.objects.filter(task=task_ref).exclude(blocker__status=TaskStatus.COMPLETED)


def claimable(qs: QuerySet[Task]) -> QuerySet[Task]:
    """Tasks anyone may start: pending, not waiting on a gate, every blocker completed."""
    return qs.filter(status=TaskStatus.PENDING, gate_pending="").filter(
        ~Exists(_unfinished_blockers(OuterRef("pk")))
    )


def task_get(*, task_id: Any) -> Task:
    try:
        return Task.objects.select_related("team", "owner", "owner__session").get(pk=int(task_id))
    except (Task.DoesNotExist, ValueError, TypeError) as exc:
        raise NotFound("No task with that id.") from exc


def task_get_visible(*, task_id: Any, actor: Principal) -> Task:
    """The task, for a caller that reads its team (`team_require_visible`). Task ids count up
    across the hub, so a task on a team the caller does not read gets the very answer of a task
    that does not exist: walking the ids tells an outsider nothing of other teams' boards."""
    try:
        task = task_get(task_id=task_id)
        team_require_visible(team=task.team, actor=actor)
    except NotFound:
        raise NotFound("No task with that id is visible to you.") from None
    return task


def _actor_member(team: Team, actor: Principal) -> Membership | None:
    """The caller's live membership (None for operators); Forbidden for outsiders."""
    return member_of_caller(team=team, actor=actor, operators=True)


def _refuse_secrets(actor: Principal, **texts: str) -> None:
    """A session may not put a credential on the board: every member reads it there, and the hub
    cannot hold it for an operator as it holds a message carrying one. An operator may."""
    if actor.is_operator:
        return
    for field, text in texts.items():
        found = secrets_in(text or "")
        if found:
            raise Invalid(
                "secret_on_board",
                f"The task's {field} holds what looks like a secret ({', '.join(f.described for f in found)}); "
                "every member reads the board. Nothing was changed. Leave the secret out, or send it "
                "as a message: the hub holds it for an operator to approve.",
            )


def _check_text(title: str, description: str) -> tuple[str, str]:
    title = (title or "").strip()
    if not title:
        raise Invalid("empty_title", "A task needs a title.")
    if len(title) > TITLE_MAX:
        raise Invalid("title_too_long", f"A task title takes at most {TITLE_MAX} characters.")
    if len(description or "") > DESCRIPTION_MAX:
        raise Invalid("description_too_long", f"A description takes at most {DESCRIPTION_MAX:,} characters.")
    return title, description or ""


def _blockers(team: Team, ids: list[int]) -> list[Task]:
    if len(ids) > MAX_BLOCKERS:
        raise Invalid("too_many_blockers", f"A task waits on at most {MAX_BLOCKERS} others.")
    wanted = {int(i) for i in ids}
    found = list(Task.objects.filter(team=team, pk__in=wanted))
    missing = wanted - {t.pk for t in found}
    if missing:
        raise NotFound(f"No tasks {sorted(missing)} on this team's board.")
    return found


def would_cycle(*, edges: dict[int, set[int]], task: int, blockers: set[int]) -> bool:
    """True when making `task` wait on `blockers` closes a loop. `edges` maps task → its blockers."""
    stack = list(blockers)
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if current == task:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(edges.get(current, ()))
    return False


def _team_edges(team: Team) -> dict[int, set[int]]:
    edges: dict[int, set[int]] = {}
    for task_id, blocker_id in TaskEdge.objects.filter(task__team=team).values_list("task_id", "blocker_id"):
        edges.setdefault(task_id, set()).add(blocker_id)
    return edges


OPEN_STATES = (TaskStatus.PENDING, TaskStatus.IN_PROGRESS)


def task_room_check(*, team: Team, member: Membership | None) -> None:
    """Refuse a session's new task when the board is full of open tasks sessions created
    (SWITCHBOARD_OPEN_TASKS_PER_TEAM) or when the session has its share open
    (SWITCHBOARD_OPEN_TASKS_PER_SESSION). The share counts the session's open tasks on every team,
    so a lead that ends its team and starts another gets no fresh bound. An operator (`member`
    None) is never refused and not counted: a board that sessions filled stays open to it. Call
    inside the transaction that writes the task, after locking the team's row."""
    if member is None:
        return
    open_tasks = Task.objects.filter(status__in=OPEN_STATES, created_by__isnull=False)
    share = settings.SWITCHBOARD_OPEN_TASKS_PER_SESSION
    if open_tasks.filter(created_by__session_id=member.session_id).count() >= share:
        raise Conflict(
            f"You already have {share} open tasks on the board (the limit for one session). "
            "Nothing was created. Complete or release some first.",
            reason="board_share_full",
        )
    cap = settings.SWITCHBOARD_OPEN_TASKS_PER_TEAM
    if open_tasks.filter(team=team).count() >= cap:
        raise Conflict(
            f"This team's board holds {cap} open tasks (the limit). Nothing was created. "
            "Complete some first, or ask an operator.",
            reason="board_full",
        )


def task_create(
    *,
    team: Team,
    actor: Principal,
    title: str,
    description: str = "",
    blocked_by: list[int] | None = None,
) -> Task:
    """Put a task on the board (any member or an operator), within the board's room
    (`task_room_check`). With a `task_created` gate, the task waits for the gate's answer before
    anyone can claim it."""
    from teams.services.gates import gate_check_open, gate_for

    member = _actor_member(team, actor)
    title, description = _check_text(title, description)
    _refuse_secrets(actor, title=title, description=description)
    blockers = _blockers(team, blocked_by or [])
    gate = gate_for(team=team, event=GateEvent.TASK_CREATED)
    with transaction.atomic():
        # One creation per team at a time, so two at once cannot both pass the count.
        Team.objects.select_for_update().filter(pk=team.pk).first()
        task_room_check(team=team, member=member)
        task = Task.objects.create(
            team=team,
            title=title,
            description=description,
            created_by=member,
            gate_pending=GateEvent.TASK_CREATED if gate else "",
        )
        TaskEdge.objects.bulk_create([TaskEdge(task=task, blocker=b) for b in blockers])
        audit_event(
            "task.created",
            actor=actor.actor,
            target=str(team.id),
            detail={"task": task.pk, "blocked_by": sorted(b.pk for b in blockers), "gated": bool(gate)},
        )
        task_announce(task)
        if gate:
            gate_check_open(gate=gate, task=task, member=member, payload={"task": task_summary(task)})
    return task


def task_link(
    *, task: Task, actor: Principal, add: list[int] | None = None, remove: list[int] | None = None
) -> Task:
    """Add or remove `blocked_by` edges. An edge that would close a cycle is refused."""
    _actor_member(task.team, actor)
    add_tasks = _blockers(task.team, add or [])
    if any(b.pk == task.pk for b in add_tasks):
        raise Invalid("dependency_cycle", "A task cannot wait on itself.")
    with transaction.atomic():
        # One dependency edit per team at a time: two edits that each look acyclic alone could
        # close a loop together if they read the edges concurrently (PostgreSQL read committed).
        Team.objects.select_for_update().filter(pk=task.team_id).first()
        locked = Task.objects.get(pk=task.pk)
        if locked.status in (TaskStatus.COMPLETED, TaskStatus.REJECTED):
            raise Conflict(f"Task {task.pk} is {locked.status}; its dependencies are settled.")
        edges = _team_edges(task.team)
        for r in remove or []:
            edges.get(task.pk, set()).discard(int(r))
        if would_cycle(edges=edges, task=task.pk, blockers={b.pk for b in add_tasks}):
            raise Invalid(
                "dependency_cycle",
                f"Making task {task.pk} wait on {sorted(b.pk for b in add_tasks)} would create a cycle.",
            )
        if remove:
            TaskEdge.objects.filter(task=task, blocker_id__in=[int(r) for r in remove]).delete()
        TaskEdge.objects.bulk_create(
            [TaskEdge(task=task, blocker=b) for b in add_tasks], ignore_conflicts=True
        )
        Task.objects.filter(pk=task.pk).update(revision=F("revision") + 1, updated_at=timezone.now())
        audit_event(
            "task.linked",
            actor=actor.actor,
            target=str(task.team_id),
            detail={"task": task.pk, "add": [b.pk for b in add_tasks], "remove": list(remove or [])},
        )
        task.refresh_from_db()
        task_announce(task)
    return task


def task_claim(*, task: Task, actor: Principal, expected_revision: int | None = None) -> Task:
    """Take an unblocked pending task. Exactly one of any number of racing claimers wins;
    the others get a Conflict saying who has it."""
    member = _actor_member(task.team, actor)
    if member is None:
        raise Forbidden("Only a member of the team claims tasks.")
    return _claim(task_id=task.pk, member=member, actor=actor, expected_revision=expected_revision)


def _claim(*, task_id: int, member: Membership, actor: Principal, expected_revision: int | None) -> Task:
    now = timezone.now()
    with transaction.atomic():
        qs = claimable(Task.objects.filter(pk=task_id, team_id=member.team_id)).filter(
            Q(owner__isnull=True) | Q(owner=member)
        )
        if expected_revision is not None:
            qs = qs.filter(revision=expected_revision)
        won = qs.update(
            status=TaskStatus.IN_PROGRESS, owner=member, revision=F("revision") + 1, updated_at=now
        )
        task = Task.objects.select_related("owner", "team").get(pk=task_id)
        if not won:
            raise Conflict(_why_not_claimable(task, expected_revision), reason="not_claimable", task=task.pk)
        audit_event(
            "task.claimed",
            actor=actor.actor,
            target=str(task.team_id),
            detail={"task": task.pk, "member": str(member.id), "revision": task.revision},
        )
        task_announce(task)
    return task


def _why_not_claimable(task: Task, expected_revision: int | None) -> str:
    if task.status != TaskStatus.PENDING:
        owner = f" by {task.owner.name}" if task.owner else ""
        return f"Task {task.pk} is already {task.status}{owner}; pick another (or claim the next one)."
    if task.gate_pending:
        return f"Task {task.pk} waits for the {task.gate_pending} quality gate."
    if _unfinished_blockers(task).exists():
        waits = sorted(_unfinished_blockers(task).values_list("blocker_id", flat=True))
        return f"Task {task.pk} is blocked by unfinished tasks {waits}."
    if task.owner_id:
        return f"Task {task.pk} is assigned to {task.owner.name}."
    if expected_revision is not None and task.revision != expected_revision:
        return f"Task {task.pk} changed (revision {task.revision}, you expected {expected_revision}); read it again."
    return f"Task {task.pk} could not be claimed."


def task_claim_next(*, team: Team, actor: Principal) -> Task | None:
    """Claim the oldest unblocked pending task (one assigned to the caller first). None when the
    board has nothing to start."""
    member = _actor_member(team, actor)
    if member is None:
        raise Forbidden("Only a member of the team claims tasks.")
    for _ in range(CLAIM_NEXT_TRIES):
        candidate = (
            claimable(Task.objects.filter(team=team))
            .filter(Q(owner__isnull=True) | Q(owner=member))
            .annotate(theirs=Case(When(owner=member, then=Value(0)), default=Value(1)))
            .order_by("theirs", "id")
            .values_list("id", flat=True)
            .first()
        )
        if candidate is None:
            return None
        try:
            return _claim(task_id=candidate, member=member, actor=actor, expected_revision=None)
        except Conflict:
            continue  # someone else won that one; try the next
    return None


def task_assign(*, task: Task, member_id: Any, actor: Principal) -> Task:
    """The lead (or an operator) gives a task to a teammate and tells it with a `task_assignment`
    frame: from the lead's session when the lead assigns, from the hub itself, naming the operator,
    when an operator does (never in the lead's name)."""
    lead = member_require_lead(team=task.team, actor=actor)
    member = member_require_live(team=task.team, member_id=member_id)
    now = timezone.now()
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.status not in (TaskStatus.PENDING, TaskStatus.IN_PROGRESS) or locked.gate_pending:
            raise Conflict(f"Task {task.pk} is {locked.status}; it cannot be assigned now.")
        blocked = _unfinished_blockers(locked).exists()
        new_status = TaskStatus.PENDING if blocked else TaskStatus.IN_PROGRESS
        Task.objects.filter(pk=task.pk, revision=locked.revision).update(
            owner=member, status=new_status, revision=F("revision") + 1, updated_at=now
        )
        locked.refresh_from_db()
        audit_event(
            "task.assigned",
            actor=actor.actor,
            target=str(task.team_id),
            detail={"task": task.pk, "member": str(member.id)},
        )
        fields = {
            "team_id": str(task.team_id),
            "task": task_summary(locked),
            "assigned_by": lead.name if lead else actor.actor,
            "blocked": blocked,
        }
        summary = f"Task {task.pk} assigned to you: {locked.title}"
        if lead is None:
            hub_notify(recipient=member.session, text=frame_text("task_assignment", fields), summary=summary)
        else:
            frame_deliver(
                sender=lead.session,
                recipient=member.session,
                frame_type="task_assignment",
                fields=fields,
                summary=summary,
                actor=actor,
            )
        task_announce(locked)
    return locked


def task_release(*, task: Task, actor: Principal) -> Task:
    """The owner (or the lead) puts an unfinished task back on the board, unowned."""
    member = _actor_member(task.team, actor)
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        _require_owner_or_lead(locked, member)
        if locked.status in (TaskStatus.COMPLETED, TaskStatus.REJECTED):
            raise Conflict(f"Task {task.pk} is {locked.status}.")
        Task.objects.filter(pk=task.pk).update(
            owner=None, status=TaskStatus.PENDING, gate_pending="", revision=F("revision") + 1
        )
        locked.refresh_from_db()
        audit_event("task.released", actor=actor.actor, target=str(task.team_id), detail={"task": task.pk})
        task_announce(locked)
    return locked


def _require_owner_or_lead(task: Task, member: Membership | None) -> None:
    if member is None:
        return  # operator
    if task.owner_id == member.id or member.role == Role.LEAD:
        return
    raise Forbidden(f"Task {task.pk} is not yours.")


def task_complete(*, task: Task, actor: Principal, result: str = "") -> Task:
    """The owner finishes a task. With a `task_completed` gate the task waits for its answer
    (`gate_pending`), then completes or goes back to in progress with the gate's reason."""
    from teams.services.gates import gate_check_open, gate_for

    member = _actor_member(task.team, actor)
    if len(result) > DESCRIPTION_MAX:
        raise Invalid("result_too_long", f"A task result takes at most {DESCRIPTION_MAX:,} characters.")
    _refuse_secrets(actor, result=result)
    gate = gate_for(team=task.team, event=GateEvent.TASK_COMPLETED)
    with transaction.atomic():
        locked = Task.objects.select_for_update(of=("self",)).select_related("team").get(pk=task.pk)
        _require_owner_or_lead(locked, member)
        if locked.status != TaskStatus.IN_PROGRESS or locked.gate_pending:
            raise Conflict(
                f"Task {task.pk} is {locked.status}"
                + (f", waiting for the {locked.gate_pending} gate" if locked.gate_pending else "")
                + "; only an in-progress task can be completed.",
                reason="not_in_progress",
            )
        if gate is None:
            return task_finish(task=locked, actor=actor, result=result)
        Task.objects.filter(pk=task.pk).update(
            gate_pending=GateEvent.TASK_COMPLETED, result=result, revision=F("revision") + 1
        )
        locked.refresh_from_db()
        audit_event(
            "task.completion_requested", actor=actor.actor, target=str(task.team_id), detail={"task": task.pk}
        )
        task_announce(locked)
        gate_check_open(gate=gate, task=locked, member=member, payload={"task": task_summary(locked)})
    return locked


def task_finish(*, task: Task, actor: Principal, result: str | None = None) -> Task:
    """Mark a task completed and tell the owners of the tasks it was the last blocker of."""
    now = timezone.now()
    updates: dict[str, Any] = {
        "status": TaskStatus.COMPLETED,
        "gate_pending": "",
        "gate_reason": "",
        "completed_at": now,
        "revision": F("revision") + 1,
        "updated_at": now,
    }
    if result is not None:
        updates["result"] = result
    with transaction.atomic():
        if Task.objects.filter(pk=task.pk, status=TaskStatus.IN_PROGRESS).update(**updates) == 0:
            task.refresh_from_db()
            return task
        task.refresh_from_db()
        audit_event("task.completed", actor=actor.actor, target=str(task.team_id), detail={"task": task.pk})
        task_announce(task)
        _tell_unblocked(task, actor)
    return task


def _tell_unblocked(done: Task, actor: Principal) -> None:
    dependants = Task.objects.filter(edges_in__blocker=done).select_related("owner__session", "team")
    for dependant in dependants:
        if _unfinished_blockers(dependant).exists():
            continue
        if dependant.status == TaskStatus.PENDING and dependant.owner_id and not dependant.gate_pending:
            Task.objects.filter(pk=dependant.pk, status=TaskStatus.PENDING).update(
                status=TaskStatus.IN_PROGRESS, revision=F("revision") + 1
            )
        dependant.refresh_from_db()
        audit_event(
            "task.unblocked", actor=actor.actor, target=str(done.team_id), detail={"task": dependant.pk}
        )
        task_announce(dependant)
        if dependant.owner_id and dependant.owner.left_at is None:
            hub_notify(
                recipient=dependant.owner.session,
                text=frame_text(
                    "task_unblocked",
                    {
                        "team_id": str(done.team_id),
                        "task": {"id": dependant.pk, "title": dependant.title, "status": dependant.status},
                        "unblocked_by": done.pk,
                        # The newest notice replaces an unread older one, so it lists them all.
                        "ready_tasks": _ready_tasks_of(dependant.owner),
                    },
                ),
                summary=f"Task {dependant.pk} is unblocked: {dependant.title}",
                notice="task_unblocked",
                source=done.team_id,
            )


def _ready_tasks_of(member: Membership) -> list[int]:
    """The member's unfinished tasks with no unfinished blocker (at most 50)."""
    owned = Task.objects.filter(owner=member, status__in=[TaskStatus.PENDING, TaskStatus.IN_PROGRESS])
    return list(
        owned.filter(~Exists(_unfinished_blockers(OuterRef("pk"))))
        .order_by("id")
        .values_list("id", flat=True)[:50]
    )


def task_summary(task: Task) -> dict[str, Any]:
    """A task as the API and live events show it."""
    blockers = list(TaskEdge.objects.filter(task=task).values_list("blocker_id", "blocker__status"))
    return {
        "id": task.pk,
        "team_id": str(task.team_id),
        "title": task.title,
        "description": task.description,
        "status": task.status,
        "owner": (
            {"member_id": str(task.owner_id), "name": task.owner.name}
            if task.owner_id and task.owner
            else None
        ),
        "blocked_by": sorted(b for b, _ in blockers),
        "blocked": any(status != TaskStatus.COMPLETED for _, status in blockers),
        "revision": task.revision,
        "gate_pending": task.gate_pending or None,
        "gate_reason": task.gate_reason or None,
        "result": task.result,
        "created_at": task.created_at.isoformat() if task.created_at else None,
        "completed_at": task.completed_at.isoformat() if task.completed_at else None,
    }


def task_announce(task: Task) -> None:
    """Tell the task's team (its browsers and members' sockets) that the task changed."""
    announce("task.changed", task_summary(task), teams=[task.team_id])
