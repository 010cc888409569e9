"""The steps of a send that the send pipeline (`messaging.services.pipeline`) is made of: the
input checks, address resolution and pins, the facts a decision needs, the rows an accepted send
writes and how they are written, and the outcome a sender is told, in a sentence it can act on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q

from messaging.addressing import (
    LEAD_ALIAS,
    Candidate,
    ParsedAddress,
    Resolution,
    parse_address,
    resolve,
    validate_address,
)
from messaging.errors import (
    HoldFull,
    Invalid,
    NotFound,
    PinConflict,
    SwitchboardError,
    TooLarge,
)
from messaging.frame_types import PROTOCOL_FRAME_TYPES
from messaging.hints import CHECK_STATUS
from messaging.hold_reasons import STOPPED_HOLD, hold_reason_text
from messaging.models import (
    LIVE_SESSION_SQL,
    AgentSession,
    AuditEvent,
    Delivery,
    DeliveryTier,
    Message,
    MessageKind,
    Pin,
    Priority,
    SessionStatus,
    Tier,
)
from messaging.names import strip_invisible
from messaging.plugins import PLUGINS
from messaging.policy import VERIFIED_TRUSTS, Verdict, inbound_decide
from messaging.principals import Principal
from messaging.sensitivity import Classification, mask_preview, mask_text, match_labels
from messaging.services.audit import audit_events_write, audit_rows
from messaging.services.bulk import (
    as_uuid,
    bulk_insert,
    insert_from_json,
    joined_models_selected,
    model_columns,
    model_instance,
    model_row,
    models_selected,
    select_columns,
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
    if state == S.RELAYED:
        if delivery.tier == DeliveryTier.RELAY:
            return (
                f"{again}QUEUED for {who} at the relay: NOT yet delivered; their hub picks it up on its "
                "next pull. Do not resend."
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


def find_candidates(sender: AgentSession, target: str) -> list[Candidate]:
    """Fetch only the live sessions the resolver could pick for `target` (uses the name_key index)."""
    return [_candidate(r) for r in _candidate_rows(parse_address(target))]


def _candidate(r: AgentSession) -> Candidate:
    return Candidate(str(r.id), r.ref, r.name, r.name_key, r.cwd)


def _candidate_rows(address: ParsedAddress) -> list[AgentSession]:
    """The live sessions an address could mean: by name key (a prefix of 3+ characters), exact
    name, id, ref, or the ref of a `name [ref]` address. Read through the live-session indexes,
    so the cost does not grow with the exited sessions a hub keeps."""
    return models_selected(
        AgentSession, _candidate_statement(*_candidate_shape(address)), _candidate_params(address)
    )


def _candidate_rows_many(addresses: list[ParsedAddress]) -> list[list[AgentSession]]:
    """`_candidate_rows` of each address, in one statement: each address's SELECT, one after
    another (UNION ALL), each row tagged with its address's place."""
    if len(addresses) == 1:
        return [_candidate_rows(addresses[0])]
    qn = connection.ops.quote_name
    table = qn(AgentSession._meta.db_table)
    columns = select_columns(AgentSession, table)
    created_at = model_columns(AgentSession).index("created_at") + 1
    parts, params = [], []
    for place, address in enumerate(addresses):
        parts.append(
            f"SELECT {columns}, {place} FROM {table} WHERE {_candidate_where(*_candidate_shape(address))}"
        )
        params += _candidate_params(address)
    sql = " UNION ALL ".join(parts) + f" ORDER BY {len(model_columns(AgentSession)) + 1}, {created_at}"
    found: list[list[AgentSession]] = [[] for _ in addresses]
    for row, place in joined_models_selected((AgentSession,), sql, params):
        found[place].append(row)
    return found


def _candidate_shape(address: ParsedAddress) -> tuple[str, bool, bool, bool, bool]:
    return (
        connection.vendor,
        len(address.key) >= 3,
        bool(address.uuid),
        bool(address.ref),
        bool(address.name_ref),
    )


def _candidate_params(address: ParsedAddress) -> list[Any]:
    params: list[Any] = [address.key, prefix_end(address.key)] if len(address.key) >= 3 else [address.key]
    params.append(address.raw)
    if address.uuid:
        params.append(AgentSession._meta.pk.get_db_prep_value(uuid.UUID(address.uuid), connection))
    params += [ref for ref in (address.ref, address.name_ref and address.name_ref[1]) if ref]
    return params


def prefix_end(prefix: str) -> str:
    """The least string above every string that starts with `prefix`, in code point order (which
    is UTF-8's byte order): `prefix <= s < prefix_end(prefix)` exactly when s starts with prefix.
    Nothing is above U+10FFFF, so trailing ones are dropped first; a prefix of nothing else gets an
    empty range, as no name holds that non-character."""
    stem = prefix.rstrip(chr(sys.maxunicode))
    if not stem:
        return prefix
    last = ord(stem[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates are not characters
        last = 0xE000
    return stem[:-1] + chr(last)


@functools.cache
def _candidate_statement(vendor: str, prefix: bool, by_id: bool, by_ref: bool, by_name_ref: bool) -> str:
    """`_candidate_rows`' SELECT for one address shape. The name key's prefix is a range in byte
    order (PostgreSQL's pattern operators: its collation may order otherwise; SQLite compares
    bytes), which an index serves in any plan, a prepared one included; a LIKE could only be served
    once the pattern is known. The live condition is in the text, where the partial indexes
    (`AgentSession.Meta.indexes`) can match it."""
    qn = connection.ops.quote_name
    return (
        f"SELECT {select_columns(AgentSession, qn(AgentSession._meta.db_table))} "
        f"FROM {qn(AgentSession._meta.db_table)} "
        f"WHERE {_candidate_where(vendor, prefix, by_id, by_ref, by_name_ref)} "
        f"ORDER BY {qn('created_at')}"
    )


@functools.cache
def _candidate_where(vendor: str, prefix: bool, by_id: bool, by_ref: bool, by_name_ref: bool) -> str:
    """The condition of `_candidate_statement`, for one address shape."""
    qn = connection.ops.quote_name
    at_least, below = ("~>=~", "~<~") if vendor == "postgresql" else (">=", "<")
    name_key, name, ref = qn("name_key"), qn("name"), qn("ref")
    arms = [f"({name_key} {at_least} %s AND {name_key} {below} %s)" if prefix else f"{name_key} = %s"]
    arms.append(f"{name} = %s")
    if by_id:
        arms.append(f"{qn('id')} = %s")
    arms += [f"{ref} = %s"] * (by_ref + by_name_ref)
    return f"({' OR '.join(arms)}) AND {LIVE_SESSION_SQL}"


def lead_candidate(sender: AgentSession) -> Candidate | None:
    lead = PLUGINS.lead_of(sender)
    if lead is None or lead.status == SessionStatus.EXITED:
        return None
    return Candidate(str(lead.id), lead.ref, lead.name, lead.name_key, lead.cwd)


def resolve_recipient(sender: AgentSession, target: str) -> tuple[AgentSession, Resolution]:
    """Resolve `target` for `sender` and apply its pins. Raises NotFound/Ambiguous/PinConflict."""
    recipient, resolution = resolve_address(sender, target)
    _check_pin_now(sender=sender, recipient=recipient, resolution=resolution, target=target)
    return recipient, resolution


def resolve_recipient_pinned(
    sender: AgentSession, target: str
) -> tuple[AgentSession, Resolution, uuid.UUID | None]:
    """`resolve_recipient`, and the id of whom the sender's pin for the name it used points at
    (None when it has no such pin, or the address is not a name): what a send compares to decide
    whether the pin must be written."""
    recipient, resolution = resolve_address(sender, target)
    pinned = pinned_recipient(sender, resolution.pin_key) if resolution.pin_key else None
    if pin_key_checked(resolution):
        pin_check(recipient=recipient, target=target, pinned_to=pinned)
    return recipient, resolution, pinned


def pinned_recipient(sender: AgentSession, pin_key: str) -> uuid.UUID | None:
    """The id of whom the sender's pin for `pin_key` points at, or None."""
    return pinned_recipient_of(sender.id, pin_key)


def pinned_recipient_of(sender_id: Any, pin_key: str) -> uuid.UUID | None:
    """`pinned_recipient` by the sender's id. Plain SQL (prepared on PostgreSQL), as a batch asks
    it for every name it sends to; compiling the ORM's query cost more than running it."""
    sender_id = AgentSession._meta.pk.get_db_prep_value(sender_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(_pin_sql(), [sender_id, pin_key])
        row = cursor.fetchone()
    return as_uuid(row[0]) if row else None


@functools.cache
def _pin_sql() -> str:
    qn = connection.ops.quote_name
    column = {name: qn(Pin._meta.get_field(name).column) for name in ("sender", "name_key", "recipient")}
    return (
        f"SELECT {column['recipient']} FROM {qn(Pin._meta.db_table)} "
        f"WHERE {column['sender']} = %s AND {column['name_key']} = %s"
    )


def _check_pin_now(
    *, sender: AgentSession, recipient: AgentSession, resolution: Resolution, target: str
) -> None:
    """`pin_check` with the sender's pin read here (a send reads it with the pair's facts instead)."""
    pin_key = pin_key_checked(resolution)
    if pin_key:
        pin_check(recipient=recipient, target=target, pinned_to=pinned_recipient(sender, pin_key))


# Resolution rules whose address is checked against (and written to) the sender's pins: only
# names (exact, normalized, prefix) can be rebound.
PIN_CHECKED_RULES = ("name", "normalized", "prefix")


def pin_key_checked(resolution: Resolution) -> str | None:
    """The pin a resolution must agree with (`PIN_CHECKED_RULES`)."""
    return resolution.pin_key if resolution.rule in PIN_CHECKED_RULES else ""


def pin_check(*, recipient: AgentSession, target: str, pinned_to: Any) -> None:
    """Raise PinConflict when the sender's pin for this name points at another session."""
    if pinned_to is None or pinned_to == recipient.id:
        return
    pinned = AgentSession.objects.get(pk=pinned_to)
    raise PinConflict(
        f"You have been talking to {pinned.label} as {target!r}, but that name now means "
        f"{recipient.label}. Address the one you mean as `name [ref]`.",
        pinned={"id": str(pinned.id), "name": pinned.name, "ref": pinned.ref},
        now={"id": str(recipient.id), "name": recipient.name, "ref": recipient.ref},
    )


def resolve_address(sender: AgentSession, target: str) -> tuple[AgentSession, Resolution]:
    """Whom `target` means for `sender`, its pin not checked (`pin_check`). Raises NotFound/Ambiguous."""
    address = parse_address(target)
    return _resolved(sender, target, address, _candidate_rows(address))


def recipients_resolved(
    wanted: list[tuple[AgentSession, str]],
) -> dict[tuple[Any, str], tuple[AgentSession, Resolution, uuid.UUID | None] | SwitchboardError]:
    """`resolve_recipient_pinned` for each (sender, address), keyed by (sender id, address): the
    sessions every address could mean read in one statement, the pins in one more."""
    addresses = {target: parse_address(target) for _sender, target in wanted}
    rows = dict(zip(addresses, _candidate_rows_many(list(addresses.values())), strict=True))
    resolved: dict[tuple[Any, str], tuple[AgentSession, Resolution] | SwitchboardError] = {}
    for sender, target in wanted:
        try:
            resolved[(sender.id, target)] = _resolved(sender, target, addresses[target], rows[target])
        except SwitchboardError as exc:
            resolved[(sender.id, target)] = exc
    pins = pins_read(
        [
            (key[0], found[1].pin_key)
            for key, found in resolved.items()
            if isinstance(found, tuple) and found[1].pin_key
        ]
    )
    out: dict[tuple[Any, str], tuple[AgentSession, Resolution, uuid.UUID | None] | SwitchboardError] = {}
    for (sender_id, target), found in resolved.items():
        if isinstance(found, SwitchboardError):
            out[(sender_id, target)] = found
            continue
        recipient, resolution = found
        pinned = pins.get((sender_id, resolution.pin_key)) if resolution.pin_key else None
        try:
            if pin_key_checked(resolution):
                pin_check(recipient=recipient, target=target, pinned_to=pinned)
        except SwitchboardError as exc:
            out[(sender_id, target)] = exc
            continue
        out[(sender_id, target)] = (recipient, resolution, pinned)
    return out


def pins_read(wanted: list[tuple[Any, str]]) -> dict[tuple[Any, str], uuid.UUID]:
    """Whom each (sender id, name key) pin points at, for the pins that exist, in one query."""
    if not wanted:
        return {}
    if len(wanted) == 1:
        sender_id, key = wanted[0]
        pinned = pinned_recipient_of(sender_id, key)
        return {} if pinned is None else {(sender_id, key): pinned}
    qn = connection.ops.quote_name
    column = {name: qn(Pin._meta.get_field(name).column) for name in ("sender", "name_key", "recipient")}
    prep = functools.partial(AgentSession._meta.pk.get_db_prep_value, connection=connection)
    pairs = sorted(set(wanted), key=str)
    sql = (
        f"SELECT {column['sender']}, {column['name_key']}, {column['recipient']} FROM {qn(Pin._meta.db_table)} "
        f"WHERE " + " OR ".join([f"({column['sender']} = %s AND {column['name_key']} = %s)"] * len(pairs))
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [value for sender_id, key in pairs for value in (prep(sender_id), key)])
        return {(as_uuid(s), key): as_uuid(r) for s, key, r in cursor.fetchall()}


def _resolved(
    sender: AgentSession, target: str, address: ParsedAddress, candidate_rows: list[AgentSession]
) -> tuple[AgentSession, Resolution]:
    """The session `address` means among its candidate rows (`_candidate_rows`); raises NotFound
    (naming an exited session as such) or Ambiguous."""
    try:
        # Look the team lead up only when the address is the `lead` alias (saves a query per send).
        lead = lead_candidate(sender) if address.key == LEAD_ALIAS else None
        rows = {str(r.id): r for r in candidate_rows}
        resolution = resolve(address, [_candidate(r) for r in rows.values()], lead=lead)
    except NotFound:
        gone = AgentSession.objects.filter(status=SessionStatus.EXITED).filter(
            Q(pk=address.uuid) if address.uuid else Q(ref=address.ref or "-")
        )
        if gone.exists():
            raise NotFound(f"The session {target!r} has exited; it can no longer receive messages.") from None
        raise
    # The row the resolver chose was fetched with the candidates (the lead alias is the exception).
    recipient = rows.get(resolution.candidate.id) or AgentSession.objects.get(pk=resolution.candidate.id)
    return recipient, resolution


def stopped_holds_checked(recipient: AgentSession) -> None:
    """Raise HoldFull when a stopped `recipient`, or the hub, holds as many messages for stopped
    sessions as it may: the caps of a decision to hold for a stopped recipient (`decide`)."""
    held = Delivery.objects.filter(state=S.HELD, hold_reason=STOPPED_HOLD)
    per_recipient = held.filter(recipient=recipient).count()
    if per_recipient >= settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT:
        raise HoldFull(
            f"{recipient.label} is stopped and already has {per_recipient} messages held for it; "
            "wait until it starts again.",
        )
    if held.count() >= settings.SWITCHBOARD_STOPPED_HOLDS_PER_HUB:
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


def idempotency_lock_id(*, sender_id: str, key: str) -> int:
    """The PostgreSQL advisory lock id of (sender, idempotency key)."""
    digest = hashlib.sha256(f"{sender_id}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


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


def files_scanned(files: list[dict[str, str]] | None) -> list[bytes]:
    """The start of each uploaded file a send attaches, for the sensitive tier to scan."""
    if not files:
        return []
    return [PLUGINS.attachments.head(sha256=str(ref.get("sha256", ""))) for ref in files]


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
