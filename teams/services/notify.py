"""Messages the team machinery writes on someone's behalf: frames and notifications.

They go through the one send service like any message, so they are persisted, have a delivery
state, are held for a stopped recipient and show up in the audit. A notification that cannot be
sent (recipient gone, hold cap full) never undoes the change that caused it: it is audited instead.

A session can make the hub write some of these at will (going idle again and again, subscribing
to an idle session, completing blockers). Those carry a `notice` kind and are bounded per kind,
source and recipient: a newer one replaces an older one still unread (queued or held) in the
recipient's inbox, and the rest take a token from a bucket of SWITCHBOARD_NOTICE_RATE per
SWITCHBOARD_NOTICE_RATE_SECONDS; past that they are dropped and audited (`team.notice_dropped`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from messaging.errors import SwitchboardError
from messaging.models import AgentSession, Delivery, Message, MessageKind
from messaging.principals import HUB, Principal, session_principal
from messaging.services.audit import audit_event
from messaging.services.delivery import delivery_transition
from messaging.services.limits import bucket_take
from messaging.services.notifications import Notice, notifications_send
from messaging.services.pipeline import message_send
from messaging.services.request import HUB_MADE, SendRequest
from messaging.services.sending import SendOutcome
from messaging.states import DeliveryState
from teams.models import NoticeSlot

log = logging.getLogger(__name__)
# Room left for the frame envelope around a final answer or report.
ENVELOPE_ROOM = 4096


def frame_text(frame_type: str, fields: dict[str, Any]) -> str:
    """The JSON text of a frame: `{"type": ..., ...}` with stable key order."""
    return json.dumps({"type": frame_type, **fields}, ensure_ascii=False, sort_keys=True)


def clip(text: str) -> tuple[str, bool]:
    """Cut text so a frame carrying it stays under the message size limit."""
    limit = max(0, settings.SWITCHBOARD_MAX_MESSAGE_CHARS - ENVELOPE_ROOM)
    if len(text) <= limit:
        return text, False
    return text[:limit], True


def frame_deliver(
    *,
    sender: AgentSession,
    recipient: AgentSession,
    frame_type: str,
    fields: dict[str, Any],
    summary: str,
    actor: Principal | None = None,
    priority: str = "normal",
) -> SendOutcome:
    """Send one frame; errors propagate (the caller's transaction decides)."""
    return message_send(
        SendRequest(
            sender=sender,
            to=str(recipient.id),
            text=frame_text(frame_type, fields),
            summary=summary[:200],
            kind=MessageKind.FRAME,
            frame_type=frame_type,
            actor=actor or session_principal(sender),
            priority=priority,
        )
    )


def notify_safely(
    *,
    sender: AgentSession,
    recipient: AgentSession,
    text: str,
    summary: str,
    kind: str = MessageKind.NOTIFICATION,
    frame_type: str = "",
    actor: Principal | None = None,
    notice: str = "",
) -> SendOutcome | None:
    """Send a notification or frame; if the send is refused, audit that and carry on. With a
    `notice` kind it is bounded per kind, sender and recipient (see the module docstring)."""
    if sender.id == recipient.id:
        return None
    try:
        with transaction.atomic():
            if notice and not notice_admitted(kind=notice, source=sender.id, recipient=recipient):
                return None
            outcome = message_send(
                SendRequest(
                    sender=sender,
                    to=str(recipient.id),
                    text=text,
                    summary=summary[:200],
                    kind=kind,
                    frame_type=frame_type,
                    actor=actor or session_principal(sender),
                    origin=HUB_MADE,
                )
            )
            if notice:
                notice_sent(kind=notice, source=sender.id, recipient=recipient, message=outcome.message)
            return outcome
    except SwitchboardError as exc:
        log.info("team notification to %s not sent: %s", recipient.id, exc.detail)
        audit_event(
            "team.notification_failed",
            actor=(actor or session_principal(sender)).actor,
            target=str(recipient.id),
            detail={"kind": kind, "frame_type": frame_type, "error": exc.code},
        )
        return None


def hub_notify(
    *,
    recipient: AgentSession,
    text: str,
    summary: str,
    notice: str = "",
    source: Any = None,
    replace_only: bool = False,
) -> Message | None:
    """A notice from the hub itself (`FROM=hub`, kind notification): facts the hub states, such as
    a task being unblocked, a gate's verdict or a request expiring. Never impersonates a session.
    Returns the stored message, or None when the recipient cannot receive (exited, user-stopped)
    or a `notice` kind from `source` is past its bound (see the module docstring). With
    `replace_only` it only rewrites the `notice` from `source` still unread, and writes nothing
    when there is none: a recipient that read the last one is not told again of less.
    Must run inside the transaction that made the change it reports."""
    with transaction.atomic():
        if notice:
            admitted = (
                notice_supersede(kind=notice, source=source, recipient=recipient)
                if replace_only
                else notice_admitted(kind=notice, source=source, recipient=recipient)
            )
            if not admitted:
                return None
        sent = notifications_send([Notice(recipient_id=recipient.id, text=text, summary=summary)])
        if not sent:
            return None
        if notice:
            notice_sent(kind=notice, source=source, recipient=recipient, message=sent[0].message)
        return sent[0].message


def notice_admitted(*, kind: str, source: Any, recipient: AgentSession) -> bool:
    """May the hub write one more `kind` notice from `source` to `recipient`? Expires the last one
    while it is unread (then yes: the recipient's unread count does not grow); otherwise spends a
    token of the (kind, source, recipient) bucket. A refusal is audited. Run inside a transaction,
    with the notice written in the same one, so a replaced notice is never lost without its successor."""
    if notice_supersede(kind=kind, source=source, recipient=recipient):
        return True
    wait = bucket_take(
        "notice",
        kind,
        source,
        recipient.id,
        capacity=settings.SWITCHBOARD_NOTICE_RATE,
        per=settings.SWITCHBOARD_NOTICE_RATE_SECONDS,
    )
    if not wait:
        return True
    audit_event(
        "team.notice_dropped",
        actor=HUB.actor,
        target=str(recipient.id),
        detail={"kind": kind, "source": str(source), "retry_after": round(wait, 1)},
    )
    return False


def notice_supersede(*, kind: str, source: Any, recipient: AgentSession) -> bool:
    """Expire the latest `kind` notice from `source` to `recipient` for a newer one, if it is still
    unread. True when it was (the newer one then takes its place). Run inside a transaction."""
    return notice_withdraw(kind=kind, source=source, recipient=recipient, why=f"superseded by a newer {kind}")


def notice_withdraw(*, kind: str, source: Any, recipient: AgentSession, why: str) -> bool:
    """Expire the latest `kind` notice from `source` to `recipient` if it is still unread (queued
    or held). True when one was. Run inside a transaction."""
    slot = NoticeSlot.objects.filter(recipient=recipient, kind=kind, source=str(source)).first()
    return slot is not None and bool(
        delivery_transition(
            Delivery.objects.filter(message_id=slot.message_id, recipient=recipient),
            to=DeliveryState.EXPIRED,
            actor=HUB,
            reason=why,
        )
    )


def notice_sent(*, kind: str, source: Any, recipient: AgentSession, message: Message) -> None:
    """Remember `message` as the latest `kind` notice from `source` to `recipient`."""
    try:
        with transaction.atomic():
            NoticeSlot.objects.update_or_create(
                recipient=recipient, kind=kind, source=str(source), defaults={"message": message}
            )
    except IntegrityError:  # a concurrent notice made the slot first: point it at this one
        NoticeSlot.objects.filter(recipient=recipient, kind=kind, source=str(source)).update(message=message)
