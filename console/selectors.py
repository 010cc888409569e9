"""Read-side queries for the operator console: the rows its pages render and the catch-up feed a
reconnecting browser asks for. Reads only; every change goes through `messaging.services`."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from messaging.models import AgentSession, AuditEvent, Delivery, Pin, SessionStatus
from messaging.services.sending import message_event
from messaging.services.sessions import session_summary
from messaging.states import DeliveryState

S = DeliveryState
FEED_LIMIT = 50
CATCH_UP_LIMIT = 1000
# Audit ids are allocated before commit, so a slow transaction can land below the cursor a browser
# already has; re-reading a few ids back costs little and the browser applies rows idempotently.
CATCH_UP_OVERLAP = 50
LIVE = (SessionStatus.BUSY, SessionStatus.IDLE)
# Why a delivery is held, in words an operator reads at a glance (codes from messaging.policy and
# the send pipeline; an unknown code is shown as it is).
HOLD_REASONS = {
    "operator_policy": "operator policy: hold",
    "sender_override_operator": "operator rule for this sender",
    "sender_override": "recipient's rule for this sender",
    "own_policy": "recipient's own policy",
    "default_bypass_receiver": "recipient runs in bypass mode",
    "default_bypass_sender": "sender runs in bypass mode",
    "sensitive": "sensitive",
    "loop_suspected": "suspected reply loop",
    "recipient_stopped": "recipient is stopped",
    "unknown_peer": "from a hub key nobody pinned: pin the key (Peers) to trust its future messages",
    "peer_revoked": "from a revoked hub (mode: hold)",
}


def hold_why(hold_reason: str, matched: list[str]) -> str:
    """Why a delivery is held, for an operator: the reason, and for a sensitive hold what matched
    ("sensitive: AWS secret access key, destructive command: git push --force")."""
    why = HOLD_REASONS.get(hold_reason, hold_reason)
    return f"{why}: {', '.join(matched)}" if matched else why


def audit_cursor() -> int:
    """The newest audit id: a page rendered now shows everything up to it."""
    return AuditEvent.objects.aggregate(top=Max("id"))["top"] or 0


def display_status(session: AgentSession, now: datetime | None = None) -> str:
    """busy / idle / dead / stopped / user_stopped / exited. `dead`: says it is live but has not been
    seen for longer than SWITCHBOARD_DEAD_AFTER_SECONDS."""
    now = now or timezone.now()
    if session.status in LIVE and session.last_seen < now - timedelta(
        seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS
    ):
        return "dead"
    return session.status


def policy_label(session: AgentSession) -> str:
    """What an operator reads in the policy column: the operator's floor, the session's own choice
    (which may only be stricter), or the default by permission mode."""
    if session.inbound_policy and session.operator_policy:
        return f"{session.inbound_policy} (operator: {session.operator_policy})"
    if session.operator_policy:
        return f"{session.operator_policy} (operator)"
    if session.inbound_policy:
        return session.inbound_policy
    return f"by mode ({session.permission_mode})"


def _teams_of(session_ids: list[Any]) -> dict[str, dict[str, str]]:
    from teams.models import Membership

    rows = Membership.objects.filter(session_id__in=session_ids, left_at__isnull=True).values(
        "session_id", "team_id", "team__name", "role"
    )
    return {
        str(r["session_id"]): {"id": str(r["team_id"]), "name": r["team__name"], "role": r["role"]}
        for r in rows
    }


def session_row(session: AgentSession, team: dict[str, str] | None, now: datetime) -> dict[str, Any]:
    return {
        **session_summary(session),
        "label": session.label,
        "display_status": display_status(session, now),
        "policy": policy_label(session),
        "operator_policy": session.operator_policy,
        "team": team,
        "last_seen_at": session.last_seen,
    }


def session_rows(*, include_exited: bool = False, ids: list[Any] | None = None) -> list[dict[str, Any]]:
    """Every session for the dashboard, newest activity first."""
    qs = AgentSession.objects.all().order_by("-last_seen")
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    elif not include_exited:
        qs = qs.exclude(status=SessionStatus.EXITED)
    sessions = list(qs[:500])
    teams = _teams_of([s.id for s in sessions])
    now = timezone.now()
    return [session_row(s, teams.get(str(s.id)), now) for s in sessions]


def _delivery_qs() -> Any:
    return Delivery.objects.select_related("message", "message__sender", "recipient")


def delivery_row(delivery: Delivery) -> dict[str, Any]:
    """A delivery as the live feed shows it: the same shape as a `message.sent` event."""
    row = message_event(delivery.message, delivery, delivery.recipient)
    row["updated_at"] = delivery.updated_at.isoformat()
    return row


def feed_rows(*, limit: int = FEED_LIMIT, session_id: Any = None) -> list[dict[str, Any]]:
    """The newest deliveries (to or from `session_id` when given)."""
    qs = _delivery_qs()
    if session_id is not None:
        qs = qs.filter(Q(recipient_id=session_id) | Q(message__sender_id=session_id))
    return [delivery_row(d) for d in qs.order_by("-id")[:limit]]


def held_count() -> int:
    return Delivery.objects.filter(state=S.HELD).count()


def session_detail(*, session_id: Any) -> dict[str, Any] | None:
    """Everything the session page shows, or None when there is no such session."""
    from messaging.services.policies import policy_view

    session = AgentSession.objects.filter(pk=session_id).first()
    if session is None:
        return None
    now = timezone.now()
    team = _teams_of([session.id]).get(str(session.id))
    pins = list(Pin.objects.filter(sender=session).select_related("recipient").order_by("name_key"))
    pinned_by = list(
        Pin.objects.filter(recipient=session).select_related("sender").order_by("sender__name_key")
    )
    counts = dict(
        Delivery.objects.filter(recipient=session).values_list("state").annotate(n=Count("id")).order_by()
    )
    return {
        "session": session,
        "row": session_row(session, team, now),
        "policy": policy_view(session=session),
        "pins": pins,
        "pinned_by": pinned_by,
        "deliveries": feed_rows(session_id=session.id, limit=100),
        "inbox_counts": counts,
        "subscriptions": _subscriptions_of(session),
        "others": list(
            AgentSession.objects.exclude(pk=session.pk)
            .exclude(status=SessionStatus.EXITED)
            .order_by("name_key")[:500]
        ),
    }


def _subscriptions_of(session: AgentSession) -> list[dict[str, Any]]:
    """`notify_when_idle` subscriptions to and from this session, newest first."""
    from teams.models import Subscription

    rows = (
        Subscription.objects.filter(Q(subscriber=session) | Q(target=session))
        .select_related("subscriber", "target")
        .order_by("-created_at")[:50]
    )
    return [
        {
            "subscriber": r.subscriber,
            "target": r.target,
            "kind": "notify_when_idle",
            "state": r.state,
            "expires_at": r.expires_at,
        }
        for r in rows
    ]


def updates_since(*, after: int) -> dict[str, Any]:
    """What changed after audit id `after`: the current rows of every delivery and session touched.
    A browser that lost its socket applies these as if the events had arrived; when too much
    changed it is told to reload instead."""
    start = max(0, after - CATCH_UP_OVERLAP)
    events = list(
        AuditEvent.objects.filter(id__gt=start)
        .order_by("id")
        .values_list("id", "kind", "target", "delivery_id")[: CATCH_UP_LIMIT + 1]
    )
    if len(events) > CATCH_UP_LIMIT:
        return {"cursor": audit_cursor(), "reload": True, "deliveries": [], "sessions": [], "teams": False}
    delivery_ids = {d for _, _, _, d in events if d}
    session_ids = {t for _, kind, t, _ in events if kind.startswith("session.") and t}
    deliveries = [delivery_row(d) for d in _delivery_qs().filter(pk__in=delivery_ids).order_by("id")]
    valid_ids = [s for s in session_ids if _is_uuid(s)]
    return {
        "cursor": max([after, *(e[0] for e in events)]),
        "reload": False,
        "deliveries": deliveries,
        "sessions": session_rows(ids=valid_ids) if valid_ids else [],
        "teams": any(kind.startswith(("team.", "task.", "membership.")) for _, kind, _, _ in events),
    }


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def audit_page(
    *, before: int | None = None, kind: str = "", actor: str = "", limit: int = 100
) -> list[AuditEvent]:
    """Audit events newest first, optionally before an id and filtered by kind prefix or actor."""
    qs = AuditEvent.objects.all().order_by("-id")
    if before:
        qs = qs.filter(id__lt=before)
    if kind:
        qs = qs.filter(kind__startswith=kind)
    if actor:
        qs = qs.filter(actor__icontains=actor)
    return list(qs[: max(1, min(limit, 500))])


BOARD_COLUMNS = ("pending", "in_progress", "completed", "rejected")


def team_rows() -> list[dict[str, Any]]:
    """Live teams for the dashboard: name, lead, roster size and open tasks."""
    from teams.models import Team

    teams = (
        Team.objects.filter(ended_at__isnull=True)
        .select_related("lead_session")
        .annotate(
            members=Count("memberships", filter=Q(memberships__left_at__isnull=True), distinct=True),
            open_tasks=Count("tasks", filter=Q(tasks__status__in=["pending", "in_progress"]), distinct=True),
        )
        .order_by("name")
    )
    return [
        {
            "id": str(t.id),
            "name": t.name,
            "lead": t.lead_session,
            "members": t.members,
            "open_tasks": t.open_tasks,
        }
        for t in teams[:200]
    ]


def team_detail(*, team_id: Any) -> dict[str, Any] | None:
    """A team's roster (with each member's session status) and its board, by column."""
    from teams.models import Membership, Task, Team

    team = Team.objects.filter(pk=team_id).select_related("lead_session").first()
    if team is None:
        return None
    now = timezone.now()
    members = list(
        Membership.objects.filter(team=team).select_related("session").order_by("left_at", "joined_at")
    )
    roster = [
        {
            "member": m,
            "session": m.session,
            "status": display_status(m.session, now),
            "active": m.left_at is None,
        }
        for m in members
    ]
    tasks = list(
        Task.objects.filter(team=team)
        .select_related("owner")
        .prefetch_related("blocked_by")
        .order_by("id")[:1000]
    )
    open_ids = {t.pk for t in tasks if t.status in ("pending", "in_progress")}
    columns: dict[str, list[dict[str, Any]]] = {c: [] for c in BOARD_COLUMNS}
    for task in tasks:
        blockers = [b for b in task.blocked_by.all()]
        columns.setdefault(task.status, []).append(
            {
                "task": task,
                "blockers": blockers,
                "blocked": any(b.pk in open_ids for b in blockers),
            }
        )
    return {
        "team": team,
        "roster": roster,
        "columns": [(name, name.replace("_", " ").capitalize(), columns[name]) for name in columns],
    }


def peer_rows() -> list[dict[str, Any]]:
    """Peer hubs for the peers page, most recently seen first, each with the short key fingerprint
    an operator compares with the one the other hub's console shows for itself."""
    from federation.models import Peer
    from federation.services.identity import key_fingerprint

    peers = Peer.objects.order_by(F("last_seen").desc(nulls_last=True), "name", "pk")[:1000]
    return [{"peer": p, "fingerprint": key_fingerprint(p.public_key)} for p in peers]
