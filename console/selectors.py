"""Read-side queries for the operator console: the rows its pages render and the catch-up feed a
reconnecting browser asks for. Reads only; every change goes through `messaging.services`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, F, Max, Q
from django.utils import timezone

from messaging.hold_reasons import hold_reason_label
from messaging.liveness import dead_sessions_q, session_liveness
from messaging.models import AgentSession, AuditEvent, Delivery, Pin, SessionStatus, Tier
from messaging.services.export import export_recent, export_record
from messaging.services.holds import holds_list
from messaging.services.sending import message_event
from messaging.services.sessions import session_summary
from messaging.states import DeliveryState
from teams.selectors import team_roster_ids

S = DeliveryState
FEED_LIMIT = 50
CATCH_UP_LIMIT = 1000
# Audit ids are allocated before commit, so a slow transaction can land below the cursor a browser
# already has; re-reading a few ids back costs little and the browser applies rows idempotently.
CATCH_UP_OVERLAP = 50


def audit_cursor() -> int:
    """The newest audit id: a page rendered now shows everything up to it."""
    return AuditEvent.objects.aggregate(top=Max("id"))["top"] or 0


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
        "display_status": session_liveness(session, now=now),
        "policy": policy_label(session),
        "operator_policy": session.operator_policy,
        "team": team,
        "last_seen_at": session.last_seen,
    }


def session_rows(
    *, include_exited: bool = False, ids: list[Any] | None = None, dead_only: bool = False
) -> list[dict[str, Any]]:
    """Every session for the dashboard (only the dead ones when `dead_only`), newest activity first."""
    qs = AgentSession.objects.all().order_by("-last_seen")
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    elif dead_only:
        qs = qs.filter(dead_sessions_q())
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


def feed_rows(
    *,
    limit: int = FEED_LIMIT,
    session_id: Any = None,
    session_ids: list[Any] | None = None,
    state: str = "",
    tier: str = "",
) -> list[dict[str, Any]]:
    """The newest deliveries: to or from `session_id` (or any of `session_ids`) when given, in
    `state` and of `tier` when given."""
    qs = _delivery_qs()
    if session_id is not None:
        session_ids = [session_id]
    if session_ids is not None:
        qs = qs.filter(Q(recipient_id__in=session_ids) | Q(message__sender_id__in=session_ids))
    if state:
        qs = qs.filter(state=state)
    if tier:
        qs = qs.filter(message__tier=tier)
    return [delivery_row(d) for d in qs.order_by("-id")[:limit]]


FEED_STATES = tuple(S.values)
FEED_TIERS = tuple(Tier.values)


def team_session_ids(team_id: Any) -> list[str]:
    """Every session that was ever on a team's roster, the lead included (what its filters mean)."""
    from teams.models import Team

    team = Team.objects.filter(pk=team_id).first()
    return sorted(str(i) for i in team_roster_ids(team)) if team else []


def held_count() -> int:
    return Delivery.objects.filter(state=S.HELD).count()


def attention(now: datetime | None = None) -> dict[str, Any]:
    """What needs a human, for the strip on every page: holds pending, how many are escalated, the
    next hold to expire (and its message), and how many sessions are dead."""
    held = Delivery.objects.filter(state=S.HELD)
    counts = held.aggregate(pending=Count("id"), escalated=Count("id", filter=Q(escalate="required")))
    nxt = (
        held.filter(expires_at__isnull=False).order_by("expires_at", "id").values("message_id", "expires_at")
    )
    first = nxt.first()
    return {
        "held": counts["pending"] or 0,
        "escalated": counts["escalated"] or 0,
        "next_expiry": first["expires_at"].isoformat() if first else None,
        "next_expiry_message": str(first["message_id"]) if first else None,
        "dead": AgentSession.objects.filter(dead_sessions_q(now)).count(),
    }


HOLD_SORTS = ("urgency", "held", "expires")


def _hold_sort_key(sort: str) -> Any:
    if sort == "held":
        return lambda h: (h["held_at"] or "", h["delivery_id"])
    if sort == "expires":
        return lambda h: (h["expires_at"] or "9999", h["delivery_id"])
    # What must stand out comes first: escalated, then sensitive, then urgent; oldest first within.
    return lambda h: (
        h["escalate"] != "required",
        h["tier"] != "sensitive",
        h["priority"] != "urgent",
        h["held_at"] or "",
        h["delivery_id"],
    )


def hold_queue(
    *, recipient_id: str | None = None, escalated_only: bool = False, sort: str = "urgency"
) -> list[dict[str, Any]]:
    """The holds page's groups: pending holds (one recipient's, only the escalated ones when
    asked), grouped and ordered by `hold_groups`."""
    rows = holds_list(recipient_id=recipient_id)
    if escalated_only:
        rows = [r for r in rows if r["escalate"] == "required"]
    return hold_groups(rows, sort=sort)


def hold_groups(holds: list[dict[str, Any]], *, sort: str = "urgency") -> list[dict[str, Any]]:
    """Holds grouped by pair (sender → recipient) and reason, so twenty loop holds between one
    pair take one decision. Each hold gets its reason in words (`why`); groups are ordered by their
    first hold under `sort` (urgency, held = longest waiting first, expires = soonest first)."""
    key = _hold_sort_key(sort if sort in HOLD_SORTS else "urgency")
    groups: dict[str, dict[str, Any]] = {}
    for hold in sorted(holds, key=key):
        hold["why"] = hold_reason_label(hold["hold_reason"], hold["matched"])
        sender_id = hold["sender"]["id"] if hold.get("sender") else "hub"
        name = f"{sender_id}:{hold['recipient']['id']}:{hold['hold_reason']}"
        group = groups.get(name)
        if group is None:
            group = groups[name] = {
                "key": name,
                "sender": hold.get("sender"),
                "recipient": hold["recipient"],
                "hold_reason": hold["hold_reason"],
                "why": hold_reason_label(hold["hold_reason"]),
                "holds": [],
            }
        group["holds"].append(hold)
    for group in groups.values():
        rows = group["holds"]
        group["count"] = len(rows)
        group["escalated"] = sum(h["escalate"] == "required" for h in rows)
        group["oldest_held_at"] = min((h["held_at"] for h in rows if h["held_at"]), default=None)
        group["next_expires_at"] = min((h["expires_at"] for h in rows if h["expires_at"]), default=None)
    return list(groups.values())


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


def team_rows_by_id(team_id: Any) -> dict[str, Any] | None:
    """One team's id and name, or None (an absent or malformed id)."""
    from teams.models import Team

    if team_id is None:
        return None
    row = Team.objects.filter(pk=team_id).values("id", "name").first()
    return {"id": str(row["id"]), "name": row["name"]} if row else None


def session_choices(limit: int = 500) -> list[AgentSession]:
    """Sessions that are not exited, by name: what a filter's session list offers."""
    return list(AgentSession.objects.exclude(status=SessionStatus.EXITED).order_by("name_key")[:limit])


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
            "status": session_liveness(m.session, now=now),
            "active": m.left_at is None,
        }
        for m in members
    ]
    tasks = list(
        Task.objects.filter(team=team)
        .select_related("owner", "created_by")
        .prefetch_related("blocked_by")
        .order_by("id")[:1000]
    )
    open_ids = {t.pk for t in tasks if t.status in ("pending", "in_progress")}
    columns: dict[str, list[dict[str, Any]]] = {c: [] for c in BOARD_COLUMNS}
    for task in tasks:
        blockers = [b for b in task.blocked_by.all()]
        open_blockers = [b for b in blockers if b.pk in open_ids]
        columns.setdefault(task.status, []).append(
            {
                "task": task,
                "blockers": blockers,
                "open_blockers": open_blockers,
                "blocked": bool(open_blockers) and task.status in ("pending", "in_progress"),
            }
        )
    return {
        "team": team,
        "roster": roster,
        "columns": [(name, name.replace("_", " ").capitalize(), columns[name]) for name in columns],
    }


PEERS_SHOWN = 1000


def peer_rows() -> list[dict[str, Any]]:
    """Peer hubs for the peers page, each with the short key fingerprint an operator compares with
    the one the other hub's console shows for itself: every key an operator pinned or revoked
    first (keys made by the thousand, each recorded on its first call, never push an operator's
    decision off the page), then the most recently seen of the others, PEERS_SHOWN in all."""
    from federation.models import Peer
    from federation.services.identity import key_fingerprint

    recent = (F("last_seen").desc(nulls_last=True), "name", "pk")
    decided = Q(pinned=True) | Q(revoked=True)
    peers = list(Peer.objects.filter(decided).order_by(*recent))
    peers += Peer.objects.exclude(decided).order_by(*recent)[: max(0, PEERS_SHOWN - len(peers))]
    return [{"peer": p, "fingerprint": key_fingerprint(p.public_key)} for p in peers]


CONVERSATION_LIMIT = 300
MAX_DEPTH = 6


def conversation(scope: Any, *, limit: int = CONVERSATION_LIMIT) -> dict[str, Any]:
    """A conversation (a pair's or a team's) as a page shows it: the newest `limit` messages,
    threaded by `in_reply_to` (a reply under what it answers, replies in time order), each with
    its recipients' states and decisions inline. Text and summary are those of the export with
    held text included: a sensitive message's secrets masked as everywhere in the console."""
    pairs = export_recent(scope, limit=limit + 1)
    truncated = len(pairs) > limit
    records = [export_record(m, ds, include_held=True) for m, ds in pairs[-limit:]]
    by_id = {r["id"]: r for r in records}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for record in records:
        parent = record["in_reply_to"] if record["in_reply_to"] in by_id else None
        children.setdefault(parent, []).append(record)
        for recipient in record["recipients"]:
            recipient["why"] = hold_reason_label(recipient["hold_reason"]) if recipient["hold_reason"] else ""
    entries: list[dict[str, Any]] = []
    # Iterative depth-first walk: a long reply chain must not exhaust Python's recursion limit.
    stack = [(r, 0) for r in reversed(children.get(None, []))]
    while stack:
        record, depth = stack.pop()
        entries.append({"m": record, "depth": min(depth, MAX_DEPTH), "reply": depth > 0})
        stack.extend((c, depth + 1) for c in reversed(children.get(record["id"], [])))
    return {"entries": entries, "count": len(records), "truncated": truncated}


def conversation_partners(*, session_id: Any, limit: int = 50) -> list[dict[str, Any]]:
    """The sessions this one exchanged messages with, most messages first: where the session
    page links a conversation from."""
    sent = (
        Delivery.objects.filter(message__sender_id=session_id)
        .exclude(recipient_id=session_id)
        .values("recipient_id")
        .annotate(n=Count("id"), last=Max("id"))
    )
    received = (
        Delivery.objects.filter(recipient_id=session_id, message__sender__isnull=False)
        .exclude(message__sender_id=session_id)
        .values("message__sender_id")
        .annotate(n=Count("id"), last=Max("id"))
    )
    tally: dict[Any, list[int]] = {}
    for row in sent:
        tally.setdefault(row["recipient_id"], [0, 0])[0] += row["n"]
    for row in received:
        tally.setdefault(row["message__sender_id"], [0, 0])[1] += row["n"]
    sessions = AgentSession.objects.in_bulk(list(tally))
    partners = [
        {"session": sessions[pk], "sent": sent_n, "received": received_n}
        for pk, (sent_n, received_n) in tally.items()
        if pk in sessions
    ]
    partners.sort(key=lambda p: (-(p["sent"] + p["received"]), p["session"].name_key))
    return partners[:limit]
