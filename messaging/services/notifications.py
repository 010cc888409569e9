"""Notifications from the hub to a session (kind=notification, no sender).

The hub tells a sender what became of a held message (approved, denied, expired, dropped) with
one of these, queued in the sender's inbox like any message. They never pass through inbound
policy or loop protection: nobody can reply to the hub, so they cannot start a loop.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from messaging.models import AgentSession, Delivery, Message, MessageKind, Priority, SessionStatus
from messaging.principals import HUB
from messaging.services.audit import audit_events_bulk
from messaging.services.transports import schedule_pushes
from messaging.states import DeliveryState

S = DeliveryState
# A session in one of these states can still receive: it reads its inbox when it is back.
CAN_RECEIVE = (SessionStatus.BUSY, SessionStatus.IDLE, SessionStatus.STOPPED)


@dataclass(frozen=True)
class Notice:
    recipient_id: Any
    text: str
    summary: str = ""
    in_reply_to_id: Any = None


def notifications_send(notices: list[Notice]) -> list[Delivery]:
    """Queue each notice for its recipient, when that session can still receive. Must run inside
    the transaction that made the change being announced, so both commit or neither does."""
    if not notices:
        return []
    ids = {n.recipient_id for n in notices}
    recipients = {s.id: s for s in AgentSession.objects.filter(pk__in=ids, status__in=CAN_RECEIVE)}
    wanted = [n for n in notices if n.recipient_id in recipients]
    if not wanted:
        return []
    now = timezone.now()
    with transaction.atomic():
        messages = Message.objects.bulk_create(
            [
                Message(
                    sender=None,
                    kind=MessageKind.NOTIFICATION,
                    text=n.text,
                    summary=n.summary[:200],
                    size=len(n.text.encode("utf-8")),
                    sha256=hashlib.sha256(n.text.encode("utf-8")).hexdigest(),
                    priority=Priority.NORMAL,
                    trust="hub",
                    to_label=recipients[n.recipient_id].ref,
                    in_reply_to_id=n.in_reply_to_id,
                )
                for n in wanted
            ]
        )
        deliveries = Delivery.objects.bulk_create(
            [
                Delivery(message=m, recipient=recipients[n.recipient_id], state=S.QUEUED, queued_at=now)
                for m, n in zip(messages, wanted, strict=True)
            ]
        )
        audit_events_bulk(
            [
                {
                    "kind": "delivery.queued",
                    "actor": HUB.actor,
                    "target": str(d.recipient_id),
                    "message": d.message,
                    "delivery_id": d.pk,
                    "detail": {"from": S.ACCEPTED, "reason": "notification"},
                }
                for d in deliveries
            ]
        )
        schedule_pushes([(d.pk, recipients[d.recipient_id]) for d in deliveries])
    return deliveries
