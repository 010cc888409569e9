"""Quality gates: optional per-team HTTP hooks on task_created, task_completed and teammate_idle.

The hub never waits on a hook inside a request. The transition enters a pending-gate state (the
task's `gate_pending`, or a deferred idle notification), a `GateCheck` row records the call, and
a background worker POSTs to the hook with a timeout:
  - 2xx: accepted, the transition happens;
  - 409 with a reason: rejected, the transition is reverted and the reason goes to the teammate;
  - timeouts, connection errors, 5xx: retried with backoff up to `max_attempts`, then the gate's
    `fail_closed` decides (block with "hook unreachable", or let the transition through);
  - any other answer is a broken hook: the same as running out of attempts; so is a URL that
    `messaging.outbound` refuses (a loopback, private, link-local or multicast destination the
    operator has not allowed), which is refused when the gate is set and again before each call.
Each attempt is claimed with a conditional update, so two workers never call the hook for the same
attempt, and a worker that dies mid-call leaves a lease the periodic sweep picks up again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from messaging.errors import Invalid, SwitchboardError
from messaging.jobs import enqueue
from messaging.outbound import destination_check, outbound_post
from messaging.principals import HUB, Principal
from messaging.services.audit import audit_event
from messaging.services.events import announce
from teams.models import CheckState, GateCheck, GateEvent, QualityGate, Task, TaskStatus, Team
from teams.services.notify import hub_notify
from teams.services.teams import member_require_lead

log = logging.getLogger(__name__)
RUN_TASK = "teams.tasks.run_gate_check"
REASON_MAX = 1000


@dataclass(frozen=True)
class HookAnswer:
    verdict: str  # accept | reject | transient | broken
    reason: str = ""


def gate_for(*, team: Team, event: str) -> QualityGate | None:
    return QualityGate.objects.filter(team=team, event=event).first()


def gate_set(
    *,
    team: Team,
    event: str,
    url: str,
    actor: Principal,
    timeout_seconds: float = 5.0,
    max_attempts: int = 3,
    fail_closed: bool = False,
) -> QualityGate:
    """Install or replace the team's hook for one event. Only the team's lead or an operator may,
    whichever surface calls: a hook decides what the team's tasks may do."""
    member_require_lead(team=team, actor=actor)
    if event not in GateEvent.values:
        raise Invalid("bad_gate_event", f"event is one of {', '.join(GateEvent.values)}.")
    if not url.startswith(("http://", "https://")) or len(url) > 500:
        raise Invalid("bad_gate_url", "A gate URL is an http(s) URL of at most 500 characters.")
    destination_check(url)  # refused here already when it points into the hub's own network
    if not (0.1 <= timeout_seconds <= 60):
        raise Invalid("bad_gate_timeout", "timeout_seconds is between 0.1 and 60.")
    if not (1 <= max_attempts <= 10):
        raise Invalid("bad_gate_attempts", "max_attempts is between 1 and 10.")
    with transaction.atomic():
        gate, _ = QualityGate.objects.update_or_create(
            team=team,
            event=event,
            defaults={
                "url": url,
                "timeout_seconds": timeout_seconds,
                "max_attempts": max_attempts,
                "fail_closed": fail_closed,
            },
        )
        audit_event(
            "gate.set",
            actor=actor.actor,
            target=str(team.id),
            detail={"event": event, "fail_closed": fail_closed},
        )
        announce("team.gate", gate_summary(gate), teams=[team.id])
    return gate


def gate_remove(*, team: Team, event: str, actor: Principal) -> bool:
    """Remove the team's hook for one event (the team's lead or an operator); False if none was set."""
    member_require_lead(team=team, actor=actor)
    with transaction.atomic():
        deleted, _ = QualityGate.objects.filter(team=team, event=event).delete()
        if deleted:
            audit_event("gate.removed", actor=actor.actor, target=str(team.id), detail={"event": event})
    return bool(deleted)


def gate_check_open(
    *, gate: QualityGate, task: Task | None = None, member: Any = None, payload: dict[str, Any]
) -> GateCheck:
    """Record a pending check and start the call in the background once this transaction commits."""
    check = GateCheck.objects.create(
        gate=gate,
        team_id=gate.team_id,
        event=gate.event,
        task=task,
        member=member,
        payload=payload,
    )
    audit_event(
        "gate.check_opened",
        actor="hub",
        target=str(gate.team_id),
        detail={"check": check.pk, "event": gate.event, "task": task.pk if task else None},
    )
    enqueue(RUN_TASK, check.pk)
    return check


def _backoff(attempt: int) -> timedelta:
    return timedelta(seconds=min(300.0, settings.SWITCHBOARD_GATE_RETRY_SECONDS * (2 ** max(0, attempt - 1))))


def gate_check_attempt(*, check_id: int, now: datetime | None = None) -> str:
    """Make one due attempt at a check. Returns its state afterwards (idempotent, any worker)."""
    now = now or timezone.now()
    check = GateCheck.objects.select_related("gate").filter(pk=check_id).first()
    if check is None or check.state != CheckState.PENDING:
        return check.state if check else "missing"
    if check.next_attempt_at and check.next_attempt_at > now:
        return check.state
    gate = check.gate
    if gate is None:
        return gate_check_decide(check=check, state=CheckState.ACCEPTED, reason="gate removed")
    lease = now + timedelta(seconds=gate.timeout_seconds + 30)
    claimed = GateCheck.objects.filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
        pk=check.pk,
        state=CheckState.PENDING,
        attempts=check.attempts,
    ).update(attempts=F("attempts") + 1, next_attempt_at=lease)
    if not claimed:
        return "busy"
    attempt = check.attempts + 1
    answer = hook_call(gate=gate, check=check)
    if answer.verdict == "accept":
        return gate_check_decide(check=check, state=CheckState.ACCEPTED, reason=answer.reason)
    if answer.verdict == "reject":
        return gate_check_decide(check=check, state=CheckState.REJECTED, reason=answer.reason)
    if answer.verdict == "transient" and attempt < gate.max_attempts:
        GateCheck.objects.filter(pk=check.pk, state=CheckState.PENDING).update(
            next_attempt_at=now + _backoff(attempt), last_error=answer.reason[:500]
        )
        audit_event(
            "gate.attempt_failed",
            actor="hub",
            target=str(check.team_id),
            detail={"check": check.pk, "attempt": attempt, "error": answer.reason[:200]},
        )
        return CheckState.PENDING
    GateCheck.objects.filter(pk=check.pk).update(last_error=answer.reason[:500])
    return gate_check_decide(check=check, state=CheckState.FAILED, reason=answer.reason)


def hook_call(*, gate: QualityGate, check: GateCheck) -> HookAnswer:
    """POST the check to the hook and classify the answer. Never raises."""
    body = {
        "event": check.event,
        "check_id": check.pk,
        "team_id": str(check.team_id),
        "task_id": check.task_id,
        "member_id": str(check.member_id) if check.member_id else None,
        **check.payload,
    }
    try:
        # Checked again at every call (the name may resolve elsewhere now), before connecting.
        response = outbound_post(gate.url, json=body, timeout=gate.timeout_seconds)
    except SwitchboardError as exc:
        return HookAnswer("broken", f"refused: {exc.detail}"[:500])
    except httpx.HTTPError as exc:
        return HookAnswer("transient", f"{type(exc).__name__}: {exc}"[:500])
    if 200 <= response.status_code < 300:
        return HookAnswer("accept")
    if response.status_code == 409:
        return HookAnswer("reject", _reason_of(response) or "rejected by the quality gate (no reason given)")
    if response.status_code >= 500 or response.status_code == 429:
        return HookAnswer("transient", f"hook answered HTTP {response.status_code}")
    return HookAnswer("broken", f"hook answered HTTP {response.status_code}")


def _reason_of(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:REASON_MAX]
    if isinstance(data, dict):
        return str(data.get("reason") or data.get("detail") or "").strip()[:REASON_MAX]
    return str(data)[:REASON_MAX]


def gate_check_decide(*, check: GateCheck, state: str, reason: str = "") -> str:
    """Settle a check once and carry out the transition it was holding (or revert it)."""
    gate = check.gate
    with transaction.atomic():
        if not GateCheck.objects.filter(pk=check.pk, state=CheckState.PENDING).update(
            state=state, reason=reason[:REASON_MAX], decided_at=timezone.now()
        ):
            return GateCheck.objects.values_list("state", flat=True).get(pk=check.pk)
        audit_event(
            f"gate.{state}",
            actor="hub",
            target=str(check.team_id),
            detail={"check": check.pk, "event": check.event, "reason": reason[:300]},
        )
        allow = state == CheckState.ACCEPTED or (
            state == CheckState.FAILED and not (gate and gate.fail_closed)
        )
        if state == CheckState.FAILED and not allow:
            reason = f"the quality gate could not be reached ({reason[:200]}), and it fails closed"
        _apply(check, allow=allow, reason=reason)
    return state


def _apply(check: GateCheck, *, allow: bool, reason: str) -> None:
    from teams.services.liveness import idle_notify_lead
    from teams.services.tasks import task_announce, task_finish

    if check.event == GateEvent.TEAMMATE_IDLE:
        member = check.member
        if member is None or member.left_at is not None:
            return
        if allow:
            idle_notify_lead(member=member, final_answer=str(check.payload.get("final_answer", "")))
        else:
            _tell(
                check,
                member.session,
                f"Your lead was not told you are idle: the team's teammate_idle quality gate sent you back. "
                f"Reason: {reason!r}\nKeep working on it, then end your turn again.",
                "Quality gate: keep working",
            )
        return
    task = Task.objects.select_related("owner__session", "created_by__session", "team").get(pk=check.task_id)
    if check.event == GateEvent.TASK_CREATED:
        if allow:
            Task.objects.filter(pk=task.pk, gate_pending=GateEvent.TASK_CREATED).update(
                gate_pending="", revision=F("revision") + 1
            )
        else:
            Task.objects.filter(pk=task.pk, gate_pending=GateEvent.TASK_CREATED).update(
                gate_pending="",
                status=TaskStatus.REJECTED,
                gate_reason=reason[:500],
                revision=F("revision") + 1,
            )
            if task.created_by_id:
                _tell(
                    check,
                    task.created_by.session,
                    f"Task {task.pk} {task.title!r} was refused by the team's task_created quality gate. "
                    f"Reason: {reason!r}",
                    f"Task {task.pk} refused by the quality gate",
                )
        task.refresh_from_db()
        task_announce(task)
        return
    if check.event == GateEvent.TASK_COMPLETED:
        if allow:
            task_finish(task=task, actor=HUB)
            return
        Task.objects.filter(pk=task.pk, gate_pending=GateEvent.TASK_COMPLETED).update(
            gate_pending="", gate_reason=reason[:500], revision=F("revision") + 1
        )
        task.refresh_from_db()
        task_announce(task)
        if task.owner_id:
            _tell(
                check,
                task.owner.session,
                f"Task {task.pk} {task.title!r} is NOT completed: the team's task_completed quality gate "
                f"refused it. Reason: {reason!r}\nIt stays in progress and yours; fix it and complete it again.",
                f"Task {task.pk} sent back by the quality gate",
            )


def _tell(check: GateCheck, recipient: Any, text: str, summary: str) -> None:
    """The hub's notice of a verdict. A task's title (any member's words) and the gate's reason
    (its server's) are quoted in it with repr, one line each, so neither reads as the hub's."""
    hub_notify(recipient=recipient, text=text, summary=summary)


def gate_checks_run_due(*, now: datetime | None = None, limit: int = 100) -> int:
    """Periodic: attempt every pending check whose next attempt (or expired lease) is due."""
    now = now or timezone.now()
    due = list(
        GateCheck.objects.filter(state=CheckState.PENDING)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    for check_id in due:
        try:
            gate_check_attempt(check_id=check_id, now=now)
        except Exception:  # one broken check must not stop the sweep
            log.exception("gate check %s failed", check_id)
    return len(due)


def gate_summary(gate: QualityGate) -> dict[str, Any]:
    return {
        "team_id": str(gate.team_id),
        "event": gate.event,
        "url": gate.url,
        "timeout_seconds": gate.timeout_seconds,
        "max_attempts": gate.max_attempts,
        "fail_closed": gate.fail_closed,
    }


def check_summary(check: GateCheck) -> dict[str, Any]:
    return {
        "id": check.pk,
        "event": check.event,
        "state": check.state,
        "task_id": check.task_id,
        "member_id": str(check.member_id) if check.member_id else None,
        "attempts": check.attempts,
        "reason": check.reason or None,
        "last_error": check.last_error or None,
        "created_at": check.created_at.isoformat() if check.created_at else None,
        "decided_at": check.decided_at.isoformat() if check.decided_at else None,
    }
