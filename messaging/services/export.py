"""Conversation export: the messages among a set of sessions (a pair, or a team's roster, which
`teams.services.export` looks up), within an optional time range, as JSON Lines or as a Markdown
transcript.

An export is for an operator, and it never reveals more than the console does: a message that a
human held, denied or let expire is exported as its state with `[<state> — text not exported]`
unless the operator asks for held text explicitly, and a sensitive-tier message's matched secrets
are masked in its text and summary as the console masks them (`mask_text`; `masked: true`).
Messages are read in batches of `BATCH` by a keyset on (created_at, id), so an export of any size
holds one batch in memory and no long transaction. Each export is audited as counts, never text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from messaging.errors import Invalid, NotFound
from messaging.models import AgentSession, Delivery, Message, Tier
from messaging.principals import Principal
from messaging.sensitivity import mask_text
from messaging.services.audit import audit_event
from messaging.states import DeliveryState

BATCH = 500
FORMATS = ("jsonl", "md")
# Deliveries a human stopped (or never let through): the text of a message with one of these in
# the conversation is not exported unless the operator asks for it.
WITHHELD_STATES = frozenset({DeliveryState.HELD, DeliveryState.DENIED, DeliveryState.EXPIRED})


@dataclass(frozen=True)
class ExportScope:
    """Which messages an export holds: sender and recipient both in `session_ids`, created in
    [since, until). `kind` and `target` name the conversation in the audit log and file name."""

    kind: str  # "pair" | "team"
    target: str
    label: str
    session_ids: frozenset[uuid.UUID]
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.since and self.until and self.since >= self.until:
            raise Invalid("bad_range", "The time range is empty: --since must be before --until.")


@dataclass
class ExportTally:
    """What an export wrote, for its audit event."""

    messages: int = 0
    withheld: int = 0
    masked: int = 0
    complete: bool = False
    states: dict[str, int] = field(default_factory=dict)


def session_by_id_or_ref(value: str) -> AgentSession:
    """The session whose id or short ref is `value` (NotFound otherwise)."""
    value = (value or "").strip()
    try:
        found = AgentSession.objects.filter(pk=uuid.UUID(value)).first()
    except ValueError:
        found = AgentSession.objects.filter(ref=value).first()
    if found is None:
        raise NotFound(f"No session has the id or ref {value!r}.")
    return found


def export_pair_scope(
    *, a: AgentSession, b: AgentSession, since: datetime | None = None, until: datetime | None = None
) -> ExportScope:
    """The conversation between two sessions, both directions."""
    if a.pk == b.pk:
        raise Invalid("bad_pair", "A pair is two different sessions.")
    return ExportScope(
        kind="pair",
        target="pair:" + ",".join(sorted((str(a.pk), str(b.pk)))),
        label=f"{a.label} and {b.label}",
        session_ids=frozenset({a.pk, b.pk}),
        since=since,
        until=until,
    )


def parse_when(raw: str | None, *, name: str) -> datetime | None:
    """An ISO 8601 date or date-time (UTC when it names no offset), or None for an empty value."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(
            "bad_time", f"{name} must be an ISO 8601 date or date-time (2026-01-31 or 2026-01-31T12:00Z)."
        ) from None
    return when if timezone.is_aware(when) else when.replace(tzinfo=UTC)


def _messages(scope: ExportScope) -> Any:
    ids = list(scope.session_ids)
    in_scope = Delivery.objects.filter(message=OuterRef("pk"), recipient_id__in=ids)
    query = Message.objects.filter(Exists(in_scope), sender_id__in=ids)
    if scope.since:
        query = query.filter(created_at__gte=scope.since)
    if scope.until:
        query = query.filter(created_at__lt=scope.until)
    return query.select_related("sender").order_by("created_at", "id")


def export_batches(
    scope: ExportScope, *, batch: int = BATCH
) -> Iterator[list[tuple[Message, list[Delivery]]]]:
    """The scope's messages in time order, `batch` at a time, each with its deliveries to
    recipients in the scope (two queries per batch, none held open between batches)."""
    query = _messages(scope)
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        page = query
        if after is not None:
            page = page.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
        messages = list(page[:batch])
        if not messages:
            return
        yield _with_deliveries(scope, messages)
        if len(messages) < batch:
            return
        after = (messages[-1].created_at, messages[-1].pk)


def export_recent(scope: ExportScope, *, limit: int) -> list[tuple[Message, list[Delivery]]]:
    """The scope's newest `limit` messages, in time order, each with its deliveries in the scope:
    what a page shows of a conversation too long to show whole."""
    newest = list(_messages(scope).order_by("-created_at", "-id")[:limit])
    newest.reverse()
    return _with_deliveries(scope, newest)


def _with_deliveries(scope: ExportScope, messages: list[Message]) -> list[tuple[Message, list[Delivery]]]:
    """Each message with its deliveries to recipients in the scope (one query)."""
    by_message: dict[uuid.UUID, list[Delivery]] = {m.pk: [] for m in messages}
    deliveries = (
        Delivery.objects.filter(message_id__in=list(by_message), recipient_id__in=list(scope.session_ids))
        .select_related("recipient")
        .order_by("id")
    )
    for delivery in deliveries:
        by_message[delivery.message_id].append(delivery)
    return [(m, by_message[m.pk]) for m in messages]


def _when(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def _party(session: AgentSession | None) -> dict[str, Any]:
    if session is None:
        return {"id": None, "name": "hub", "ref": ""}
    return {"id": str(session.pk), "name": session.name, "ref": session.ref}


def export_record(
    message: Message, deliveries: list[Delivery], *, include_held: bool = False
) -> dict[str, Any]:
    """One message as an export record (the JSON Lines schema; the Markdown transcript renders it)."""
    withheld = next((d.state for d in deliveries if d.state in WITHHELD_STATES), "")
    masked = message.tier == Tier.SENSITIVE
    text, summary = message.text, message.summary
    if masked:
        text, summary = mask_text(text), mask_text(summary)
    if withheld and not include_held:
        text, summary = f"[{withheld} — text not exported]", ""
    return {
        "id": str(message.pk),
        "created_at": _when(message.created_at),
        "sender": _party(message.sender),
        "recipients": [
            {
                **_party(d.recipient),
                "state": d.state,
                "hold_reason": d.hold_reason,
                "decided_by": d.decided_by,
                "decision_reason": d.decision_reason,
                "final_at": _when(d.final_at),
            }
            for d in deliveries
        ],
        "summary": summary,
        "in_reply_to": str(message.in_reply_to_id) if message.in_reply_to_id else None,
        "kind": message.kind,
        "frame_type": message.frame_type,
        "tier": message.tier,
        "trust": message.trust,
        "withheld": withheld or None,
        "text_exported": not withheld or include_held,
        "masked": masked,
        "text": text,
    }


def export_records(
    scope: ExportScope, *, include_held: bool = False, tally: ExportTally | None = None
) -> Iterator[dict[str, Any]]:
    """Every record of the scope, in time order, counted into `tally` as they are read."""
    tally = tally if tally is not None else ExportTally()
    for page in export_batches(scope):
        for message, deliveries in page:
            record = export_record(message, deliveries, include_held=include_held)
            tally.messages += 1
            tally.withheld += bool(record["withheld"])
            tally.masked += bool(record["masked"])
            for d in deliveries:
                tally.states[d.state] = tally.states.get(d.state, 0) + 1
            yield record


def render_jsonl(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    """One JSON object per line."""
    for record in records:
        yield json.dumps(record, ensure_ascii=False) + "\n"


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _who(party: dict[str, Any]) -> str:
    return f"{party['name']} [{party['ref']}]" if party["ref"] else party["name"]


def render_markdown(
    records: Iterable[dict[str, Any]], *, scope: ExportScope, include_held: bool = False
) -> Iterator[str]:
    """A readable transcript: a header naming the conversation and range, then each message in
    time order with its recipients' states and decisions, and its text in a code fence (so
    nothing an agent wrote renders as Markdown)."""
    since, until = _when(scope.since) or "the beginning", _when(scope.until) or "now"
    yield f"# Conversation: {scope.label}\n\n"
    yield f"- {scope.kind}; messages from {since} until {until}\n"
    yield f"- exported {_when(timezone.now())}\n"
    yield "- held, denied and expired messages: " + (
        "text included (--include-held)\n" if include_held else "state only, text not exported\n"
    )
    yield "- sensitive-tier messages: masked\n\n"
    count = 0
    for record in records:
        count += 1
        to = ", ".join(_who(r) for r in record["recipients"])
        yield f"## {record['created_at']} · {_who(record['sender'])} → {to}\n\n"
        facts = [
            f"`{record['id']}`",
            record["kind"] + (f" ({record['frame_type']})" if record["frame_type"] else ""),
        ]
        facts += [f"tier {record['tier']}", f"trust {record['trust']}"]
        if record["in_reply_to"]:
            facts.append(f"in reply to `{record['in_reply_to']}`")
        if record["withheld"]:
            facts.append(f"**{record['withheld']}**")
        if record["masked"]:
            facts.append("**masked**")
        yield " · ".join(facts) + "\n\n"
        for r in record["recipients"]:
            decision = ""
            if r["decided_by"]:
                decision = f", decided by {r['decided_by']}" + (
                    f": {r['decision_reason']}" if r["decision_reason"] else ""
                )
            hold = f" ({r['hold_reason']})" if r["hold_reason"] else ""
            yield f"- {_who(r)}: {r['state']}{hold}{decision}\n"
        if record["summary"]:
            yield f"\nSummary: {record['summary']}\n"
        fence = _fence(record["text"])
        yield f"\n{fence}text\n{record['text']}\n{fence}\n\n"
    if not count:
        yield "No messages.\n"


def export_stream(
    scope: ExportScope, *, fmt: str, actor: Principal, include_held: bool = False
) -> Generator[str, None, None]:
    """The export as text chunks, in `fmt` ("jsonl" or "md"), audited once it ends (or is cut
    short by the reader) with what was written: counts, never text."""
    if fmt not in FORMATS:
        raise Invalid("bad_format", "The export format is jsonl or md.")
    actor.require_operator()
    return _audited(scope, fmt=fmt, actor=actor, include_held=include_held)


def _audited(
    scope: ExportScope, *, fmt: str, actor: Principal, include_held: bool
) -> Generator[str, None, None]:
    tally = ExportTally()
    records = export_records(scope, include_held=include_held, tally=tally)
    chunks = (
        render_jsonl(records)
        if fmt == "jsonl"
        else render_markdown(records, scope=scope, include_held=include_held)
    )
    try:
        yield from chunks
        tally.complete = True
    finally:
        audit_event(
            "conversation.exported",
            actor=actor.actor,
            target=scope.target,
            detail={
                "scope": scope.kind,
                "format": fmt,
                "since": _when(scope.since),
                "until": _when(scope.until),
                "include_held": include_held,
                "messages": tally.messages,
                "withheld": tally.withheld,
                "masked": tally.masked,
                "states": tally.states,
                "complete": tally.complete,
            },
        )


def export_filename(scope: ExportScope, *, fmt: str) -> str:
    """A file name that says what the export holds: switchboard-<kind>-<label>-<time>.<fmt>."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", scope.label).strip("-").lower().removeprefix(f"{scope.kind}-")
    slug = slug[:80].strip("-") or "conversation"
    return f"switchboard-{scope.kind}-{slug}-{timezone.now():%Y%m%dT%H%M%SZ}.{fmt}"
