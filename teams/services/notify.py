"""Messages the team machinery writes on someone's behalf: frames and notifications.

They go through the one send service like any message, so they are persisted, have a delivery
state, are held for a stopped recipient and show up in the audit. A notification that cannot be
sent (recipient gone, hold cap full) never undoes the change that caused it: it is audited instead.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from messaging.errors import SwitchboardError
from messaging.models import AgentSession, Message, MessageKind
from messaging.principals import Principal, session_principal
from messaging.services.audit import audit_event
from messaging.services.notifications import Notice, notifications_send
from messaging.services.sending import SendOutcome, message_send

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
        sender=sender,
        to=str(recipient.id),
        text=frame_text(frame_type, fields),
        summary=summary[:200],
        kind=MessageKind.FRAME,
        frame_type=frame_type,
        actor=actor or session_principal(sender),
        priority=priority,
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
) -> SendOutcome | None:
    """Send a notification or frame; if the send is refused, audit that and carry on."""
    if sender.id == recipient.id:
        return None
    try:
        with transaction.atomic():
            return message_send(
                sender=sender,
                to=str(recipient.id),
                text=text,
                summary=summary[:200],
                kind=kind,
                frame_type=frame_type,
                actor=actor or session_principal(sender),
                hub_made=True,
            )
    except SwitchboardError as exc:
        log.info("team notification to %s not sent: %s", recipient.id, exc.detail)
        audit_event(
            "team.notification_failed",
            actor=(actor or session_principal(sender)).actor,
            target=str(recipient.id),
            detail={"kind": kind, "frame_type": frame_type, "error": exc.code},
        )
        return None


def hub_notify(*, recipient: AgentSession, text: str, summary: str) -> Message | None:
    """A notice from the hub itself (`FROM=hub`, kind notification): facts the hub states, such as
    a task being unblocked, a gate's verdict or a request expiring. Never impersonates a session.
    Returns the stored message, or None when the recipient cannot receive (exited, user-stopped).
    Must run inside the transaction that made the change it reports."""
    sent = notifications_send([Notice(recipient_id=recipient.id, text=text, summary=summary)])
    return sent[0].message if sent else None
