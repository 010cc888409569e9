"""Holds: deliveries waiting for a human (policy hold, sensitive tier, suspected loop).

An operator approves (→ queued, then pushed) or denies (→ denied) each one, alone or many at once.
No decision before the deadline → expired by the periodic sweeper (database clock). At most
`SWITCHBOARD_HOLDS_PER_RECIPIENT` wait per recipient, counted apart for the holds of hub keys
nobody vouched for (`PEER_HOLDS`: first contact, revoked with mode hold) and for all others, so keys
made at home never take the room of other holds. A sender makes room only among its own holds (of
its kind): at the cap, its own oldest is expired for its new one; with none to give up, its new
message is refused (`hold_full`) and nothing expires. One sender's messages never expire another's.
The sender learns every outcome from the delivery's state and from a hub notification.

What an operator reads of a sensitive message has its matched secrets masked; approving an
escalated hold takes a reason; revealing the text as sent is an audited action of its own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.dispatch import Signal

from messaging.errors import HoldFull, Invalid, NotFound
from messaging.framing import sender_facts
from messaging.hold_reasons import PEER_HOLDS, STOPPED_HOLD
from messaging.models import AgentSession, Delivery, Message, Tier
from messaging.policy import VERIFIED_TRUSTS
from messaging.principals import HUB, Principal
from messaging.sensitivity import mask_preview, mask_text, match_labels
from messaging.services.audit import audit_event
from messaging.services.delivery import Moved, delivery_transition
from messaging.services.notifications import Notice, notifications_send
from messaging.services.transports import schedule_pushes
from messaging.states import DeliveryState

S = DeliveryState
MAX_BULK = 1000


# Sent once the transaction that wrote them commits, with `delivery_ids`: new holds with
# escalate=required (a human must look). For whoever cares (operator alerts): messaging does not
# know who listens.
escalated_holds_created = Signal()


def escalated_holds_announce(deliveries: list[Delivery]) -> None:
    """After the commit, tell `escalated_holds_created` listeners which of `deliveries` are new
    escalated holds (none: nothing is sent)."""
    ids = [d.pk for d in deliveries if d.state == S.HELD and d.escalate == "required"]
    if ids:
        transaction.on_commit(lambda: escalated_holds_created.send(sender=Delivery, delivery_ids=ids))


def hold_expiry_seconds_of(recipient: AgentSession) -> int:
    """How long a hold for `recipient` waits for an operator: the session's setting, else the hub's."""
    return recipient.hold_expiry_seconds or settings.SWITCHBOARD_HOLD_EXPIRY_SECONDS


def hold_expiry_for(recipient: AgentSession, now: datetime) -> datetime:
    """When a hold for `recipient` made at `now` expires."""
    return now + timedelta(seconds=hold_expiry_seconds_of(recipient))


def _holds_counted_with(recipient_id: Any, hold_reason: str) -> QuerySet[Delivery]:
    """The holds for an operator that a new hold for `hold_reason` shares the cap with: those of
    hub keys nobody vouched for (`PEER_HOLDS`), or all the others (never the stopped recipient's,
    which have their own cap)."""
    held = Delivery.objects.filter(recipient_id=recipient_id, state=S.HELD)
    if hold_reason in PEER_HOLDS:
        return held.filter(hold_reason__in=PEER_HOLDS)
    return held.exclude(hold_reason__in=(STOPPED_HOLD, *PEER_HOLDS))


def holds_counted(*, recipient_id: Any, sender_id: Any, hold_reason: str) -> tuple[int, int]:
    """The holds for `recipient_id` that a new hold for `hold_reason` shares the cap with: (all of
    them, `sender_id`'s), in one query."""
    counts = _holds_counted_with(recipient_id, hold_reason).aggregate(
        held=Count("id"), own=Count("id", filter=Q(message__sender_id=sender_id))
    )
    return int(counts["held"]), int(counts["own"])


def holds_full(recipient: AgentSession, *, own: int) -> HoldFull:
    """The refusal of a new hold when `recipient`'s holds are at the cap and too few (`own`) of
    them are the sender's to make room with. It names the cap, never how many messages
    others have waiting for the recipient is their traffic, not the sender's to learn."""
    yours = "none of them is yours" if not own else "too few of them are yours"
    return HoldFull(
        f"{recipient.label} has as many messages waiting for an operator as it may "
        f"({settings.SWITCHBOARD_HOLDS_PER_RECIPIENT}), and {yours} to make room with; other "
        "senders' holds are never dropped for yours. Wait until an operator has decided some of "
        "them, then send again.",
    )


def holds_over(recipient: AgentSession, *, held: int, own: int) -> int:
    """How many of the sender's own holds must expire before one more fits among `recipient`'s
    `held` holds (`holds_counted`: all of those the new one shares the cap with, `own` of them the
    sender's): 0 below the cap. Raise HoldFull when the sender has too few of its own to give up."""
    over = held - settings.SWITCHBOARD_HOLDS_PER_RECIPIENT + 1
    if over <= 0:
        return 0
    if over > own:
        raise holds_full(recipient, own=own)
    return over


def holds_make_room(
    *, recipient: AgentSession, sender: AgentSession, hold_reason: str, over: int
) -> list[Moved]:
    """Before holding one more message from `sender` for `recipient` (for `hold_reason`), at the
    cap: expire the sender's own `over` oldest holds that the new one shares the cap with
    (`holds_over`), so it fits, and tell the sender. Never another sender's. Runs inside the send
    transaction, after the count that gave `over`."""
    own_holds = _holds_counted_with(recipient.id, hold_reason).filter(message__sender_id=sender.id)
    oldest = list(own_holds.order_by("held_at", "id").values_list("id", flat=True)[:over])
    moved = delivery_transition(
        Delivery.objects.filter(pk__in=oldest),
        to=S.EXPIRED,
        actor=HUB,
        reason="hold_overflow",
        updates={"decision_reason": "hold_overflow"},
    )
    holds_notify(moved, outcome="overflow")
    return moved


def holds_list(*, recipient_id: str | None = None) -> list[dict[str, Any]]:
    """Pending holds, oldest first: who sent what to whom, why it waits and until when."""
    qs = Delivery.objects.filter(state=S.HELD).select_related("message", "message__sender", "recipient")
    if recipient_id:
        qs = qs.filter(recipient_id=recipient_id)
    return [hold_summary(d) for d in qs.order_by("-priority", "held_at", "id")[:MAX_BULK]]


PREVIEW_CHARS = 300


def hold_summary(d: Delivery) -> dict[str, Any]:
    """One hold as the API and console show it (a preview, never the audit): a sensitive
    message's secrets masked, and what the sensitive tier matched, in words."""
    m = d.message
    sender = m.sender
    sensitive = m.tier == Tier.SENSITIVE
    return {
        "id": d.pk,
        "delivery_id": d.pk,
        "message_id": str(m.id),
        "sender": sender_facts(sender, vouched=m.trust in VERIFIED_TRUSTS),
        "recipient": {"id": str(d.recipient.id), "name": d.recipient.name, "ref": d.recipient.ref},
        "tier": m.tier,
        "trust": m.trust,
        "priority": "urgent" if m.priority else "normal",
        "escalate": d.escalate or None,
        "hold_reason": d.hold_reason,
        "matched": match_labels(m.matched),
        "summary": mask_text(m.summary) if sensitive else m.summary,
        "preview": mask_preview(m.text, PREVIEW_CHARS) if sensitive else m.text[:PREVIEW_CHARS],
        "size": m.size,
        "held_at": d.held_at.isoformat() if d.held_at else None,
        "expires_at": d.expires_at.isoformat() if d.expires_at else None,
        "headless": d.recipient.headless,
    }


def holds_decide(
    *, delivery_ids: list[int], approve: bool, actor: Principal, reason: str = ""
) -> list[Moved]:
    """An operator approves (→ queued and pushed) or denies (→ denied) held deliveries. Returns the
    ones that moved; those already decided or expired are skipped. Each sender is notified."""
    actor.require_operator()
    ids = sorted({int(i) for i in delivery_ids})
    if not ids:
        raise Invalid("empty_ids", "Name at least one hold to decide.")
    if len(ids) > MAX_BULK:
        raise Invalid("bad_limit", f"Decide at most {MAX_BULK} holds at a time.")
    reason = (reason or "").strip()[:500]
    to = S.QUEUED if approve else S.DENIED
    if (
        approve
        and not reason
        and Delivery.objects.filter(pk__in=ids, state=S.HELD, escalate="required").exists()
    ):
        raise Invalid(
            "reason_required",
            "Approving an escalated hold takes a reason: say why this message may reach its recipient "
            "(the reason is kept in the audit and told to the sender).",
        )
    with transaction.atomic():
        moved = delivery_transition(
            Delivery.objects.filter(pk__in=ids, state=S.HELD),
            to=to,
            actor=actor,
            reason=reason,
            updates={"decided_by": actor.actor, "decision_reason": reason, "expires_at": None},
        )
        if approve:
            recipients = {
                r.id: r for r in AgentSession.objects.filter(pk__in={m.recipient_id for m in moved})
            }
            schedule_pushes([(m.delivery_id, recipients[m.recipient_id]) for m in moved])
        holds_notify(moved, outcome="approved" if approve else "denied", reason=reason)
    return moved


def message_reveal(*, message_id: Any, actor: Principal) -> Message:
    """An operator asks to see a message as sent, secrets unmasked: returns it, and audits who
    revealed it (the audit keeps the message's length and SHA-256, never its text)."""
    actor.require_operator()
    message = Message.objects.filter(pk=message_id).first()
    if message is None:
        raise NotFound(f"No message {message_id}.")
    audit_event(
        "message.revealed",
        actor=actor.actor,
        target=str(message.id),
        message=message,
        detail={"matched": match_labels(message.matched)},
    )
    return message


def holds_notify(moved: list[Moved], *, outcome: str, reason: str = "") -> None:
    """Tell each sender what became of its held message (skips hub-originated messages)."""
    moved = [m for m in moved if m.sender_id]
    if not moved:
        return
    rows = {
        d.pk: d
        for d in Delivery.objects.filter(pk__in=[m.delivery_id for m in moved]).select_related(
            "recipient", "message"
        )
    }
    notices = []
    for m in moved:
        d = rows[m.delivery_id]
        notices.append(
            Notice(
                recipient_id=m.sender_id,
                text=_outcome_text(d, outcome, reason),
                summary=f"message {outcome}",
                in_reply_to_id=m.message_id,
            )
        )
    notifications_send(notices)


def _outcome_text(d: Delivery, outcome: str, reason: str) -> str:
    who = d.recipient.label
    what = f"Your message {d.message_id} to {who}"
    if d.message.summary:
        # The notice is hub traffic the console shows as it is: the summary's secrets masked.
        what += f" ({mask_text(d.message.summary)!r})"
    if outcome == "approved":
        return f"{what} was approved by an operator and is now queued for them. Do not resend it."
    if outcome == "denied":
        because = f": {reason}" if reason else " (no reason given)"
        return f"{what} was denied by an operator{because}. It was not delivered; do not resend it."
    if outcome == "overflow":
        return (
            f"{what} was dropped unread: {who} had too many messages waiting for an operator, and it was "
            "the oldest of yours, expired to make room for your newer one. Send again later if it still "
            "matters."
        )
    if outcome == "exited":
        return f"{what} expired: {who} exited before it was delivered."
    if d.hold_reason == STOPPED_HOLD:
        return f"{what} expired: {who} did not start again before the hold ran out."
    if d.recipient.headless:
        return (
            f"{what} expired: {who} runs headless and no operator approved it before the deadline. "
            "Ask an operator to change its inbound policy if it should accept your messages."
        )
    return f"{what} expired: no operator approved it before the deadline. It was not delivered."
