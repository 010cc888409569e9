"""How long the hub keeps what it no longer needs, and deleting a session's data on request.

Retention (periodic, `messaging.tasks.purge_expired`):
- a message goes with its deliveries once it is older than SWITCHBOARD_MESSAGE_RETENTION_DAYS and
  every one of its deliveries is in a final state (read, refused, denied, expired, failed); a held,
  queued, delivered-but-unread or relayed delivery keeps its message whatever its age;
- an exited session goes once it has been gone SWITCHBOARD_SESSION_RETENTION_DAYS and nothing
  refers to it any more (no delivery to it, no team it leads or belongs to);
- 0 days keeps that kind of row forever.

Purges run in batches of PURGE_BATCH rows, one short transaction each, so sends never wait long
for a lock, and at most PURGE_BATCHES batches a run (the next run goes on). Each run that
deleted anything writes one audit event with the counts, never a text.

Apps above `messaging` hear `messages_purged` (with the message ids) to drop what they keep per
message (federation: the message's attached files).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.dispatch import Signal
from django.utils import timezone

from messaging.errors import NotFound
from messaging.models import AgentSession, Delivery, Message, Pin, SenderPolicy, SessionStatus
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.states import FINAL_STATES

log = logging.getLogger(__name__)

PURGE_BATCH = 500
PURGE_BATCHES = 40

# Sent after a transaction that deleted messages commits: `message_ids` (a list of UUIDs).
messages_purged = Signal()


@dataclass(frozen=True)
class Purged:
    """What one retention run deleted."""

    messages: int = 0
    deliveries: int = 0
    sessions: int = 0


def _messages_delete(ids: list[Any]) -> int:
    """Delete these messages and their deliveries in the caller's transaction; announce the ids
    after the commit. Returns how many deliveries went with them."""
    _, by_model = Delivery.objects.filter(message_id__in=ids).delete()
    Message.objects.filter(id__in=ids).delete()
    transaction.on_commit(lambda: messages_purged.send(sender=Message, message_ids=ids))
    return by_model.get(Delivery._meta.label, 0)


def messages_purge_expired(*, now: datetime | None = None) -> tuple[int, int]:
    """Delete messages past retention whose deliveries are all final; (messages, deliveries)."""
    days = settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS
    if days <= 0:
        return 0, 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    open_delivery = Delivery.objects.filter(message_id=OuterRef("pk")).exclude(state__in=FINAL_STATES)
    expired = Message.objects.filter(created_at__lt=cutoff).exclude(Exists(open_delivery))
    messages = deliveries = 0
    for _ in range(PURGE_BATCHES):
        ids = list(expired.order_by("created_at").values_list("id", flat=True)[:PURGE_BATCH])
        if not ids:
            break
        with transaction.atomic():
            deliveries += _messages_delete(ids)
        messages += len(ids)
    return messages, deliveries


def sessions_purge_expired(*, now: datetime | None = None) -> int:
    """Delete exited sessions gone longer than retention that nothing refers to any more."""
    days = settings.SWITCHBOARD_SESSION_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    gone = (
        AgentSession.objects.filter(status=SessionStatus.EXITED, last_seen__lt=cutoff)
        .exclude(kind="remote")  # stand-ins for other hubs' agents: federation keeps those
        .exclude(Exists(Delivery.objects.filter(recipient_id=OuterRef("pk"))))
        .exclude(Q(led_teams__isnull=False) | Q(memberships__isnull=False))
    )
    deleted = 0
    for _ in range(PURGE_BATCHES):
        ids = list(gone.values_list("id", flat=True)[:PURGE_BATCH])
        if not ids:
            break
        with transaction.atomic():
            AgentSession.objects.filter(id__in=ids).delete()
        deleted += len(ids)
    return deleted


def retention_purge(*, now: datetime | None = None) -> Purged:
    """One retention run: expired messages (with their deliveries), then exited sessions."""
    messages, deliveries = messages_purge_expired(now=now)
    sessions = sessions_purge_expired(now=now)
    purged = Purged(messages=messages, deliveries=deliveries, sessions=sessions)
    if messages or sessions:
        audit_event(
            "retention.purged",
            actor="hub",
            detail={"messages": messages, "deliveries": deliveries, "sessions": sessions},
        )
        log.info("retention: %d messages, %d deliveries, %d sessions purged", messages, deliveries, sessions)
    return purged


def session_data_delete(*, session_id: Any, actor: Principal) -> dict[str, int]:
    """An operator deletes one session's data on request: every message it sent, every delivery
    to it (and each message left with no delivery), its pins and per-sender policies either way.
    The session row stays (exited, token revoked elsewhere) so the audit still names it. Audited
    with the counts."""
    actor.require_operator()
    session = AgentSession.objects.filter(pk=session_id).first()
    if session is None:
        raise NotFound("No session with that id.")
    with transaction.atomic():
        sent = list(Message.objects.filter(sender_id=session.pk).values_list("id", flat=True))
        received = list(
            Delivery.objects.filter(recipient_id=session.pk).values_list("message_id", flat=True).distinct()
        )
        Delivery.objects.filter(recipient_id=session.pk).exclude(message_id__in=sent).delete()
        orphaned = list(
            Message.objects.filter(id__in=received)
            .exclude(id__in=sent)
            .exclude(Exists(Delivery.objects.filter(message_id=OuterRef("pk"))))
            .values_list("id", flat=True)
        )
        for start in range(0, len(sent) + len(orphaned), PURGE_BATCH):
            _messages_delete((sent + orphaned)[start : start + PURGE_BATCH])
        pins, _ = Pin.objects.filter(Q(sender_id=session.pk) | Q(recipient_id=session.pk)).delete()
        policies, _ = SenderPolicy.objects.filter(
            Q(sender_id=session.pk) | Q(recipient_id=session.pk)
        ).delete()
        counts = {
            "messages_sent": len(sent),
            "messages_received": len(received),
            "messages_deleted": len(sent) + len(orphaned),
            "pins": pins,
            "sender_policies": policies,
        }
        audit_event("session.data_deleted", actor=actor.actor, target=str(session.pk), detail=counts)
    return counts
