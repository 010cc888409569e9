"""Whom an address means: the live sessions it could name, read through the live-session
indexes (one statement for any number of addresses), the resolver's choice among them
(`messaging.addressing.resolve`), and the sender's pins, which keep a name bound to the session it
first reached (a name that now means someone else raises PinConflict).
"""

from __future__ import annotations

import functools
import sys
import uuid
from typing import Any

from django.db import connection
from django.db.models import Q

from messaging.addressing import LEAD_ALIAS, Candidate, ParsedAddress, Resolution, parse_address, resolve
from messaging.errors import NotFound, PinConflict, SwitchboardError
from messaging.models import LIVE_SESSION_SQL, AgentSession, Pin, SessionStatus
from messaging.plugins import PLUGINS
from messaging.services.bulk import (
    as_uuid,
    joined_models_selected,
    model_columns,
    models_selected,
    select_columns,
)


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
    sender: AgentSession, target: str, *, prefixes: bool = True
) -> tuple[AgentSession, Resolution, uuid.UUID | None]:
    """`resolve_recipient`, and the id of whom the sender's pin for the name it used points at
    (None when it has no such pin, or the address is not a name): what a send compares to decide
    whether the pin must be written. Without `prefixes`, only an exact address resolves
    (`messaging.addressing.resolve`)."""
    recipient, resolution = resolve_address(sender, target, prefixes=prefixes)
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


def resolve_address(
    sender: AgentSession, target: str, *, prefixes: bool = True
) -> tuple[AgentSession, Resolution]:
    """Whom `target` means for `sender`, its pin not checked (`pin_check`); without `prefixes`,
    only an exact address. Raises NotFound/Ambiguous."""
    address = parse_address(target)
    return _resolved(sender, target, address, _candidate_rows(address), prefixes=prefixes)


def recipients_resolved(
    wanted: list[tuple[AgentSession, str, bool]],
) -> dict[tuple[Any, str, bool], tuple[AgentSession, Resolution, uuid.UUID | None] | SwitchboardError]:
    """`resolve_recipient_pinned` for each (sender, address, prefixes), keyed by the same triple with
    the sender's id: the sessions every address could mean read in one statement, the pins in one
    more."""
    addresses = {target: parse_address(target) for _sender, target, _prefixes in wanted}
    rows = dict(zip(addresses, _candidate_rows_many(list(addresses.values())), strict=True))
    resolved: dict[tuple[Any, str, bool], tuple[AgentSession, Resolution] | SwitchboardError] = {}
    for sender, target, prefixes in wanted:
        key = (sender.id, target, prefixes)
        try:
            resolved[key] = _resolved(sender, target, addresses[target], rows[target], prefixes=prefixes)
        except SwitchboardError as exc:
            resolved[key] = exc
    pins = pins_read(
        [
            (key[0], found[1].pin_key)
            for key, found in resolved.items()
            if isinstance(found, tuple) and found[1].pin_key
        ]
    )
    out: dict[
        tuple[Any, str, bool], tuple[AgentSession, Resolution, uuid.UUID | None] | SwitchboardError
    ] = {}
    for (sender_id, target, prefixes), found in resolved.items():
        if isinstance(found, SwitchboardError):
            out[(sender_id, target, prefixes)] = found
            continue
        recipient, resolution = found
        pinned = pins.get((sender_id, resolution.pin_key)) if resolution.pin_key else None
        try:
            if pin_key_checked(resolution):
                pin_check(recipient=recipient, target=target, pinned_to=pinned)
        except SwitchboardError as exc:
            out[(sender_id, target, prefixes)] = exc
            continue
        out[(sender_id, target, prefixes)] = (recipient, resolution, pinned)
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
    sender: AgentSession,
    target: str,
    address: ParsedAddress,
    candidate_rows: list[AgentSession],
    *,
    prefixes: bool,
) -> tuple[AgentSession, Resolution]:
    """The session `address` means among its candidate rows (`_candidate_rows`), by a unique
    prefix too when `prefixes`; raises NotFound (naming an exited session as such) or Ambiguous."""
    try:
        # Look the team lead up only when the address is the `lead` alias (saves a query per send).
        lead = lead_candidate(sender) if address.key == LEAD_ALIAS else None
        rows = {str(r.id): r for r in candidate_rows}
        resolution = resolve(address, [_candidate(r) for r in rows.values()], lead=lead, prefixes=prefixes)
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
