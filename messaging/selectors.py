"""Read-side queries: discovery, a session by the id or ref a caller names, a message's state and
history, the audit feed."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from django.db.models import Q, QuerySet

from messaging.errors import NotFound
from messaging.models import REMOTE_KIND, AgentSession, AuditEvent, Message, SessionStatus, Tier
from messaging.plugins import PLUGINS
from messaging.principals import Principal
from messaging.sensitivity import mask_text
from messaging.services.delivery import told_of_moves
from messaging.services.sessions import session_summary


def agents_list(
    *, viewer: Principal, include_exited: bool = False, name: str | None = None, include_remote: bool = True
) -> list[dict[str, Any]]:
    """Sessions a caller can address (or could, once they start again); with `include_remote`,
    also the agents other hubs host, each with the tier (channel, lan, relay) it is reached on.
    A session's socket inbox (`peer_address`, a path on this machine) is shown only to itself
    and operators: to anyone else it would only say where that session's messages are written.
    So are its permission mode and inbound policy: to another session they would only say which
    sessions run tools without asking and let a stranger's message straight through."""
    qs: QuerySet[AgentSession] = AgentSession.objects.all().order_by("name_key", "created_at")
    if not include_exited:
        qs = qs.exclude(status=SessionStatus.EXITED)
    if name:
        from messaging.names import normalize_name

        qs = qs.filter(name_key__startswith=normalize_name(name))
    local = [dict(session_summary(s), tier="host") for s in qs.exclude(kind=REMOTE_KIND)]
    if not viewer.is_operator:
        own = str(viewer.session.id) if viewer.session is not None else None
        for row in local:
            if row["id"] != own:
                row.update(peer_address="", permission_mode=None, inbound_policy=None)
    if not include_remote:
        return local
    return local + PLUGINS.other_hubs.agents(name=name)


def open_session_of(caller: Principal, ref: str) -> AgentSession:
    """The session a caller names: `me` (its own), or any open session's id or ref (NotFound for
    an exited one). Who may act on it is the service's rule, not this lookup's."""
    if ref == "me":
        return caller.require_session()
    query = Q(ref=ref)
    with contextlib.suppress(ValueError):
        query |= Q(pk=uuid.UUID(ref))
    found = AgentSession.objects.filter(query).exclude(status=SessionStatus.EXITED).first()
    if found is None:
        raise NotFound(f"No live session has the id or ref {ref!r}.")
    return found


def message_for_viewer(*, message_id: str, viewer: Principal) -> Message:
    """The message, when the viewer is its sender (the session told of its moves, `told_of_moves`:
    never the session a notification is about) or an operator; NotFound for everyone else, so a
    stranger cannot even learn that the id exists."""
    try:
        message = Message.objects.select_related("sender").get(pk=message_id)
    except (Message.DoesNotExist, ValueError, Exception) as exc:  # bad UUIDs raise ValidationError
        raise NotFound("No message with that id is visible to you.") from exc
    if viewer.is_operator:
        return message
    if viewer.session is not None and told_of_moves(message) == viewer.session.id:
        return message
    raise NotFound("No message with that id is visible to you.")


def message_status(message: Message) -> dict[str, Any]:
    """A message's current state per recipient and its full history, from the audit."""
    deliveries = list(message.deliveries.select_related("recipient").order_by("id"))
    remote = PLUGINS.other_hubs.progress(delivery_ids=[d.pk for d in deliveries])
    history = [
        {
            "at": e.at.isoformat(),
            "event": e.kind,
            "state": e.kind.split(".", 1)[1] if e.kind.startswith("delivery.") else None,
            "actor": e.actor,
            "detail": e.detail,
        }
        for e in AuditEvent.objects.filter(message_id=message.id).order_by("id")
    ]
    first = deliveries[0] if deliveries else None
    return {
        "id": str(message.id),
        "status": first.state if first else "accepted",
        "kind": message.kind,
        "tier": message.tier,
        "trust": message.trust,
        "priority": "urgent" if message.priority else "normal",
        # A sensitive message's summary with its secrets masked, as everywhere a status is shown.
        "summary": mask_text(message.summary) if message.tier == Tier.SENSITIVE else message.summary,
        "size": message.size,
        "sha256": message.sha256,
        "created_at": message.created_at.isoformat(),
        "from": {"id": str(message.sender.id), "name": message.sender.name, "ref": message.sender.ref}
        if message.sender
        else None,
        "to": {"id": str(first.recipient.id), "name": first.recipient.name, "ref": first.recipient.ref}
        if first
        else None,
        "deliveries": [
            {
                "delivery_id": d.pk,
                "recipient": {"id": str(d.recipient.id), "name": d.recipient.name, "ref": d.recipient.ref},
                "state": d.state,
                "tier": d.tier,
                "hold_reason": d.hold_reason or None,
                "escalate": d.escalate or None,
                "expires_at": d.expires_at.isoformat() if d.expires_at else None,
                "decided_by": d.decided_by or None,
                "decision_reason": d.decision_reason or None,
                "remote": remote.get(d.pk),
                "timestamps": {
                    k: getattr(d, f"{k}_at").isoformat() if getattr(d, f"{k}_at") else None
                    for k in ("queued", "held", "delivered", "read", "relayed", "final")
                },
            }
            for d in deliveries
        ],
        "history": history,
    }


def audit_list(*, after_id: int = 0, limit: int = 100, kind: str | None = None) -> list[dict[str, Any]]:
    qs = AuditEvent.objects.filter(id__gt=after_id).order_by("id")
    if kind:
        qs = qs.filter(kind__startswith=kind)
    return [
        {
            "id": e.id,
            "at": e.at.isoformat(),
            "kind": e.kind,
            "actor": e.actor,
            "target": e.target,
            "message_id": str(e.message_id) if e.message_id else None,
            "delivery_id": e.delivery_id,
            "length": e.length,
            "sha256": e.sha256 or None,
            "detail": e.detail,
        }
        for e in qs[: max(1, min(limit, 1000))]
    ]
