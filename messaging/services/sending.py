"""The steps of a send that the send pipeline (`messaging.services.pipeline`) is made of: the
input checks, the facts a decision needs, the rows an accepted send writes and how they are
written, and the outcome a sender is told, in a sentence it can act on. Whom an address means is
`messaging.services.recipients`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Q

from messaging.addressing import (
    validate_address,
)
from messaging.errors import (
    HoldFull,
    Invalid,
    NotFound,
    TooLarge,
)
from messaging.frame_types import PROTOCOL_FRAME_TYPES
from messaging.hints import CHECK_STATUS
from messaging.hold_reasons import STOPPED_HOLD, hold_reason_text
from messaging.models import (
    AgentSession,
    AuditEvent,
    Delivery,
    DeliveryTier,
    Message,
    MessageKind,
    Priority,
    Tier,
)
from messaging.names import strip_invisible
from messaging.plugins import PLUGINS
from messaging.policy import VERIFIED_TRUSTS, Verdict, inbound_decide
from messaging.principals import Principal
from messaging.sensitivity import Classification, mask_preview, mask_text, match_labels
from messaging.services.audit import audit_events_write, audit_rows
from messaging.services.bulk import (
    bulk_insert,
    insert_from_json,
    model_columns,
    model_instance,
    model_row,
)
from messaging.services.decision import Decision, DecisionFacts
from messaging.services.holds import escalated_holds_announce, hold_expiry_seconds_of
from messaging.services.pair import dedupe_key, pair_key
from messaging.states import DeliveryState

S = DeliveryState


@dataclass
class SendOutcome:
    """What became of one send: the stored message, its delivery and a sentence for the sender."""

    message: Message
    delivery: Delivery
    recipient: AgentSession
    duplicate: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.delivery.state

    @property
    def result(self) -> str:
        return outcome_sentence(self.delivery, self.recipient, duplicate=self.duplicate)

    @property
    def hint(self) -> str | None:
        """What the sender may do next (`messaging.hints`): follow a message still on its way."""
        on_its_way = self.delivery.state == S.QUEUED or (
            self.delivery.state == S.RELAYED and self.delivery.tier == DeliveryTier.RELAY
        )
        return CHECK_STATUS if on_its_way else None

    def as_dict(self) -> dict[str, Any]:
        """The answer every surface gives a sender: id, state, recipient and the sentence."""
        r = self.recipient
        return {
            "id": str(self.message.id),
            "status": self.status,
            "to": {"id": str(r.id), "name": r.name, "ref": r.ref},
            "result": self.result,
            "hint": self.hint,
            "tier": self.message.tier,
            "trust": self.message.trust,
            "duplicate": self.duplicate,
        }


def outcome_sentence(delivery: Delivery, recipient: AgentSession, *, duplicate: bool = False) -> str:
    """One sentence telling the sender what happened and whether to retry, wait or give up."""
    who = f"{recipient.name} [{recipient.ref}]"
    again = "This is the original send (same idempotency key or identical text); " if duplicate else ""
    state = delivery.state
    if state == S.QUEUED:
        if recipient.peer_address:  # written to its listener after the commit (`services.transports`)
            return f"{again}Queued for {who}: the hub writes it to their socket listener now; do not resend."
        return f"{again}Queued for {who}: it reaches them at their next tool call or turn; do not resend."
    if state == S.DELIVERED:
        return f"{again}Delivered to {who}; they have not acknowledged reading it yet. Do not resend."
    if state == S.READ:
        return f"{again}Delivered to {who}, who has read it. Wait for their reply; do not resend."
    if state == S.HELD:
        if delivery.hold_reason == STOPPED_HOLD:
            return (
                f"{again}HELD for {who}: they are stopped; the hub keeps it and delivers it when they "
                f"start again, until {delivery.expires_at:%Y-%m-%d %H:%M} UTC. Do not resend."
            )
        return (
            f"{again}HELD for {who} until an operator approves it: {hold_reason_text(delivery.hold_reason)}. "
            f"It expires at {delivery.expires_at:%Y-%m-%d %H:%M:%S} UTC if nobody decides. Do not resend; wait."
        )
    if state == S.REFUSED:
        return f"{again}REFUSED by {who} ({delivery.decision_reason or 'inbound policy'}); do not retry."
    if state == S.DENIED:
        return f"{again}DENIED by an operator: {delivery.decision_reason or 'no reason given'}. Do not retry."
    if state == S.EXPIRED:
        return f"{again}EXPIRED before it reached {who} ({delivery.decision_reason or 'hold expired'})."
    if state == S.FAILED:
        why = (delivery.decision_reason or "delivery failed").rstrip(". ")
        return f"{again}FAILED: it did not reach {who}: {why}. Nothing more is tried; send it again once that has changed."
    if state == S.RELAYED:
        if delivery.tier == DeliveryTier.RELAY:
            return (
                f"{again}QUEUED for {who} through the relay: NOT yet delivered; their hub picks it up "
                "from the relay on its next pull (while the relay cannot be reached, this hub keeps "
                "trying). Do not resend."
            )
        return (
            f"{again}Handed to {who}'s hub ({delivery.tier} tier); not yet confirmed delivered. "
            "Do not resend; its state follows the other hub's receipts."
        )
    return f"{again}{state} for {who}."


# One encoder for every fingerprint (json.dumps builds one per call when given an option). The
# text it writes is stored (Message.request_hash) and compared on retries: keep it byte for byte.
_FINGERPRINT_JSON = json.JSONEncoder(ensure_ascii=False)


def request_fingerprint(
    *, to: str, text: str, summary: str, priority: str, kind: str, frame_type: str
) -> str:
    body = _FINGERPRINT_JSON.encode([to, text, summary, priority, kind, frame_type])
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def validate_message_input(*, text: str, summary: str, kind: str) -> str:
    """Check the text and summary of a send; return the text with invisible characters removed."""
    if not isinstance(text, str):
        raise Invalid("bad_message", "`message` is plain text.")
    limit = settings.SWITCHBOARD_MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise TooLarge(
            f"The message has {len(text):,} characters; the limit is {limit:,}. "
            "Split it, or send a file path instead.",
            size=len(text),
            limit=limit,
        )
    if len(summary) > settings.SWITCHBOARD_MAX_SUMMARY_CHARS:
        raise Invalid(
            "summary_too_long",
            f"The summary has {len(summary)} characters; it takes at most {settings.SWITCHBOARD_MAX_SUMMARY_CHARS}.",
        )
    cleaned, _removed = strip_invisible(text)
    if not cleaned.strip():
        raise Invalid("empty_message", "The message has no visible text.")
    if kind == MessageKind.TEXT and looks_like_protocol_frame(cleaned):
        raise Invalid(
            "protocol_frame_text",
            "Plain text that parses as a team protocol frame is refused; use the typed team API for "
            "shutdown, plan, permission, mode and task frames.",
        )
    return cleaned


@dataclass(frozen=True)
class CheckedInput:
    """A send's input after the checks that need no database: cleaned, with its fingerprint."""

    target: str
    text: str
    summary: str
    priority: int
    fingerprint: str  # of the request, for idempotency keys
    sha256: str  # of the text, for dedupe and the audit
    size: int  # of the text, in UTF-8 bytes


def send_input_checked(
    *,
    to: str,
    text: str,
    summary: str,
    priority: str,
    idempotency_key: str | None,
    kind: str,
    frame_type: str,
) -> CheckedInput:
    """Every check of a send's input that needs no database, in the order a sender meets them;
    raises the first failure (Invalid / TooLarge)."""
    target = validate_address(to)
    summary = strip_invisible(summary or "")[0].strip()
    text = validate_message_input(text=text, summary=summary, kind=kind)
    if priority not in ("normal", "urgent"):
        raise Invalid("bad_priority", "priority is `normal` or `urgent`.")
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 128):
        raise Invalid("bad_idempotency_key", "idempotency_key takes 1 to 128 characters.")
    fingerprint = request_fingerprint(
        to=target, text=text, summary=summary, priority=priority, kind=kind, frame_type=frame_type
    )
    encoded = text.encode("utf-8")
    return CheckedInput(
        target=target,
        text=text,
        summary=summary,
        priority=Priority.URGENT if priority == "urgent" else Priority.NORMAL,
        fingerprint=fingerprint,
        sha256=hashlib.sha256(encoded).hexdigest(),
        size=len(encoded),
    )


def looks_like_protocol_frame(text: str) -> bool:
    """True when plain text is a JSON object whose `type` is one of the protocol frame types."""
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return False
    try:
        parsed = json.loads(stripped)
    except ValueError:
        return False
    return isinstance(parsed, dict) and str(parsed.get("type", "")).lower() in PROTOCOL_FRAME_TYPES


def stopped_holds_checked(
    recipient: AgentSession, *, whose: Q, yours: str = "yours", written: bool = False
) -> None:
    """Raise HoldFull when a stopped `recipient` holds as many messages as it may, or as many of
    one sender's as one sender may (so no sender takes all of its room), or when the hub holds as
    many of that sender's for stopped sessions as one sender may (so no sender, holding messages
    for many stopped sessions, takes all of the hub's room), or as many in all as it may: the caps
    of a decision to hold for a stopped recipient.

    `whose` picks the sender's deliveries out of all (a session's: `told_of_moves_is`; another
    hub's, as federation counts it: all of its key's stand-ins'), and `yours` names them in a
    refusal. `written`: the message being held is already written in the
    caller's transaction, so each count holds it (and `whose` picks it) on top of those before it.
    Two counts: the recipient's, then the hub's (the sender's part of each in the same statement)."""
    new = int(written)  # the caps bound the holds before this one
    held = Delivery.objects.filter(state=S.HELD, hold_reason=STOPPED_HOLD)
    counts = held.filter(recipient=recipient).aggregate(all=Count("id"), own=Count("id", filter=whose))
    if counts["all"] - new >= settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT:
        raise HoldFull(  # the cap, never the count: others' messages to it are not the sender's to learn
            f"{recipient.label} is stopped and has as many messages held for it as it may "
            f"({settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT}); wait until it starts again.",
        )
    if (own := counts["own"] - new) >= settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER:
        raise HoldFull(
            f"{recipient.label} is stopped and already has {own} of {yours} held for it, as "
            "many as one sender may; wait until it starts again.",
        )
    hub = held.aggregate(all=Count("id"), own=Count("id", filter=whose))
    if (own := hub["own"] - new) >= settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB:
        raise HoldFull(
            f"This hub already holds {own} of {yours} for stopped sessions, as many as one "
            "sender may; wait until they start again.",
        )
    if hub["all"] - new >= settings.SWITCHBOARD_STOPPED_HOLDS_PER_HUB:
        raise HoldFull("This hub holds as many messages for stopped sessions as it may; try later.")


def inbound_verdict(
    *,
    sender: AgentSession,
    recipient: AgentSession,
    sensitive: bool,
    trust: str,
    override: str | None,
    by_operator: bool,
) -> Verdict:
    """The recipient's inbound policy (messaging.policy) applied to this sender and message."""
    return inbound_decide(
        receiver_mode=recipient.permission_mode,
        sender_mode=sender.permission_mode,
        receiver_policy=recipient.inbound_policy,
        operator_policy=recipient.operator_policy,
        sender_override=override,
        override_by_operator=by_operator,
        sensitive=sensitive,
        sensitive_exempt=sensitive
        and trust in VERIFIED_TRUSTS
        and (sender.sensitive_exempt or settings.SWITCHBOARD_SENSITIVE_EXEMPT_VERIFIED),
    )


def decision_facts(
    *,
    sender: AgentSession,
    recipient: AgentSession,
    classification: Classification,
    trust: str,
    kind: str,
    override: str | None,
    by_operator: bool,
    looping: bool,
    now: datetime,
    verdict: Verdict | None = None,
) -> DecisionFacts:
    """What `decide` needs of a message to a local recipient, from what the send has read
    (`verdict`: the recipient's inbound policy when the caller has it already)."""
    if verdict is None:
        verdict = inbound_verdict(
            sender=sender,
            recipient=recipient,
            sensitive=classification.tier == Tier.SENSITIVE,
            trust=trust,
            override=override,
            by_operator=by_operator,
        )
    return DecisionFacts(
        classification=classification,
        trust=trust,
        verdict=verdict,
        override=override,
        override_by_operator=by_operator,
        looping=looping,
        kind=kind,
        recipient_status=recipient.status,
        now=now,
        hold_seconds=hold_expiry_seconds_of(recipient),
        stopped_hold_seconds=settings.SWITCHBOARD_STOPPED_HOLD_SECONDS,
    )


def accepted_message(
    *,
    message_id: Any = None,
    sender: AgentSession,
    recipient: AgentSession,
    kind: str,
    frame_type: str = "",
    text: str,
    summary: str,
    size: int,
    sha256: str,
    priority: int,
    decision: Decision,
    target: str,
    idempotency_key: str | None,
    fingerprint: str,
    in_reply_to: Any,
    now: datetime,
) -> Message:
    """The Message row an accepted send to `recipient` writes (not saved: `messages_write` writes it)."""
    return model_instance(
        Message,
        {
            "id": uuid.UUID(str(message_id)) if message_id else uuid.uuid4(),
            "sender_id": sender.id,
            "kind": kind,
            "frame_type": frame_type,
            "text": text,
            "summary": summary,
            "size": size,
            "sha256": sha256,
            "tier": decision.tier,
            "matched": " ".join(decision.sensitivity.matches)[:500] if decision.sensitivity else "",
            "priority": priority,
            "trust": decision.trust,
            "to_label": target,
            "idempotency_key": idempotency_key,
            "request_hash": fingerprint,
            "dedupe_key": dedupe_key(sender.id, sha256),
            "pair_key": pair_key(sender.id, recipient.id),
            "in_reply_to_id": in_reply_to,
            "created_at": now,
        },
        sender=sender,
    )


def first_delivery(
    *, message: Message, recipient: AgentSession, decision: Decision, tier: str, now: datetime
) -> Delivery:
    """The message's Delivery row in the state the send decided (not saved: see `messages_write`)."""
    state = decision.state
    return model_instance(
        Delivery,
        {
            "message_id": message.id,
            "recipient_id": recipient.id,
            "state": state,
            "tier": tier,
            "priority": message.priority,
            "hold_reason": decision.hold_reason,
            "escalate": decision.escalate,
            "expires_at": decision.expires_at,
            "decision_reason": decision.reason,
            "created_at": now,
            "updated_at": now,
            "queued_at": now if state == S.QUEUED else None,
            "held_at": now if state == S.HELD else None,
            "final_at": now if state == S.REFUSED else None,
            "relayed_at": now if state == S.RELAYED else None,
        },
        message=message,
        recipient=recipient,
    )


# An acceptance event's delivery id before the delivery is written: `messages_write` puts in the
# id the database gives the delivery of the event's message.
DELIVERY_OF_ITS_MESSAGE = -1


def messages_write(
    accepted: list[tuple[Message, Delivery]], *, now: datetime, audit: list[dict[str, Any]]
) -> None:
    """Insert the messages, then their deliveries, one statement each however many there are;
    each delivery gets the id the database gave it. Then `audit`, their acceptance events
    (`acceptance_audit`; see DELIVERY_OF_ITS_MESSAGE). On PostgreSQL all of it is one statement:
    one round trip, and a send outside a transaction needs no BEGIN and COMMIT."""
    # Ids and the send's time go as text, each turned into text once (not once per column).
    when = str(now)
    message_rows, delivery_rows = [], []
    for message, delivery in accepted:
        message_id = message.id.hex
        row = model_row(message, model_columns(Message))
        row["id"] = message_id
        if row["sender_id"] is not None:
            row["sender_id"] = row["sender_id"].hex
        if row["created_at"] is now:
            row["created_at"] = when
        message_rows.append(row)
        row = model_row(delivery, model_columns(Delivery)[1:])  # all but the id, which the database gives
        row.update(message_id=message_id, recipient_id=delivery.recipient_id.hex)
        for name in ("created_at", "updated_at", "queued_at", "held_at", "final_at", "relayed_at"):
            if row[name] is now:
                row[name] = when
        delivery_rows.append(row)
    if connection.vendor == "postgresql":
        given = _write_with_audit(message_rows, delivery_rows, audit_rows(audit))
        for message, delivery in accepted:
            delivery.pk = given[message.id]
    else:
        bulk_insert(model=Message, rows=message_rows)
        ids = bulk_insert(model=Delivery, rows=delivery_rows, returning="id")
        for (_message, delivery), pk in zip(accepted, ids, strict=True):
            delivery.pk = pk
        delivery_of = {message.id: delivery.pk for message, delivery in accepted}
        for row in audit:
            if row.get("delivery_id") == DELIVERY_OF_ITS_MESSAGE:
                row["delivery_id"] = delivery_of[row["message"].id]
        audit_events_write(audit)
    # Every hold a send makes is written here, so this is where new escalated holds are told.
    escalated_holds_announce([delivery for _message, delivery in accepted])


def _write_with_audit(
    message_rows: list[dict[str, Any]], delivery_rows: list[dict[str, Any]], events: list[dict[str, Any]]
) -> dict[uuid.UUID, int]:
    """PostgreSQL: messages, deliveries and audit events in one statement. Returns the id each
    message's delivery was given."""
    messages_sql, messages_doc = insert_from_json(Message, message_rows)
    deliveries_sql, deliveries_doc = insert_from_json(Delivery, delivery_rows)
    events_sql, events_doc = insert_from_json(
        AuditEvent,
        events,
        values={
            "delivery_id": f"CASE WHEN r.delivery_id = {DELIVERY_OF_ITS_MESSAGE} THEN d.id ELSE r.delivery_id END"
        },
        join=f"LEFT JOIN d ON r.delivery_id = {DELIVERY_OF_ITS_MESSAGE} AND d.message_id = r.message_id",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH m AS ({messages_sql}), d AS ({deliveries_sql} RETURNING id, message_id), "
            f"a AS ({events_sql}) SELECT message_id, id FROM d",
            [messages_doc, deliveries_doc, events_doc],
        )
        return {message_id: pk for message_id, pk in cursor.fetchall()}


def acceptance_audit(
    *, actor: Principal, message: Message, delivery: Delivery, rule: str, decision: Decision
) -> list[dict[str, Any]]:
    """The two events every accepted send records, written by `messages_write` with the message:
    the message accepted, and its delivery's first state (with the hold or refusal reason)."""
    target = str(delivery.recipient_id)
    why = decision.hold_reason or decision.reason
    # What the sensitive tier found, in words and masked ("AWS secret access key wJal…EKEY"):
    # the audit names what matched, never the secret.
    matched = [f.described for f in decision.sensitivity.findings] if decision.sensitivity else []
    return [
        {
            "kind": "message.accepted",
            "actor": actor.actor,
            "target": target,
            "message": message,
            "detail": {"to": message.to_label, "rule": rule, "kind": message.kind},
        },
        {
            "kind": f"delivery.{decision.state}",
            "actor": actor.actor,
            "target": target,
            "message": message,
            "delivery_id": DELIVERY_OF_ITS_MESSAGE,  # written with it: `messages_write` fills it in
            "detail": {
                "from": S.ACCEPTED,
                **({"reason": why} if why else {}),
                **({"matched": matched[:20]} if matched else {}),
            },
        },
    ]


def reply_checked(sender: AgentSession, in_reply_to: str | None) -> None:
    """Raise NotFound unless `in_reply_to` (when given) is a message `sender` sent or received."""
    if not in_reply_to:
        return
    try:
        uuid.UUID(str(in_reply_to))
    except ValueError:
        raise Invalid("bad_in_reply_to", "in_reply_to is a message id (a UUID).") from None
    theirs = Q(sender=sender) | Q(deliveries__recipient=sender)
    if not Message.objects.filter(theirs, pk=in_reply_to).exists():
        raise NotFound(
            f"in_reply_to: there is no message {in_reply_to} that you sent or received.",
            reason="in_reply_to",
        )


def files_scanned(files: list[dict[str, str]] | None, *, sender: AgentSession) -> list[bytes]:
    """The start of each file a send attaches, for the sensitive tier to scan: only files the
    sender holds, so a file it only names (another session's) leaves the send's classification,
    and its answer, as an unknown one would (attaching either then fails alike)."""
    if not files:
        return []
    return [PLUGINS.attachments.head(sha256=str(ref.get("sha256", "")), holder_id=sender.id) for ref in files]


def message_event(message: Message, delivery: Delivery, recipient: AgentSession) -> dict[str, Any]:
    """The live-feed description of a message: metadata and a short preview, never for the audit.
    A sensitive message's matched secrets are masked in its preview and summary."""
    sender = message.sender
    sensitive = message.tier == Tier.SENSITIVE
    return {
        "message_id": str(message.id),
        "delivery_id": delivery.pk,
        "from": {"id": str(sender.id), "name": sender.name, "ref": sender.ref} if sender else None,
        "to": {"id": str(recipient.id), "name": recipient.name, "ref": recipient.ref},
        "state": delivery.state,
        "tier": message.tier,
        "trust": message.trust,
        "kind": message.kind,
        "priority": Priority(message.priority).label,
        "summary": mask_text(message.summary) if sensitive else message.summary,
        "preview": mask_preview(message.text, 200) if sensitive else message.text[:200],
        "matched": match_labels(message.matched) if message.matched else [],
        "hold_reason": delivery.hold_reason,
        "escalate": delivery.escalate,
        "expires_at": delivery.expires_at.isoformat() if delivery.expires_at else None,
        "created_at": message.created_at.isoformat(),
    }
