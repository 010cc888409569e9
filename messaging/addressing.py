"""Recipient resolution: a pure function from an address and the live sessions to one recipient.

Order (first rule that matches wins):
  1. the reserved alias ``lead`` (the sender's team lead);
  2. an exact session id or ref;
  3. an exact name;
  4. ``name [ref]``: the ref picks the session, and the name must be that session's;
  5. the normalized name (NFKC + casefold);
  6. a unique normalized prefix of at least 3 characters.
Two or more matches at a rule raise `Ambiguous` with up to three candidates: never a guess.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from messaging.errors import Ambiguous, Invalid, NotFound
from messaging.hints import LIST_AGENTS
from messaging.names import normalize_name

LEAD_ALIAS = "lead"
MIN_PREFIX = 3
MAX_CANDIDATES_SHOWN = 3
_NAME_REF = re.compile(r"^(?P<name>.*?\S)\s*\[(?P<ref>[A-Za-z0-9]+)\]$")


@dataclass(frozen=True)
class Candidate:
    id: str
    ref: str
    name: str
    name_key: str
    cwd: str = ""


@dataclass(frozen=True)
class Resolution:
    candidate: Candidate
    rule: str  # lead | id | ref | name | name_ref | normalized | prefix
    pin_key: str | None  # the normalized name the sender used, for pin checks; None for id/ref/lead


@dataclass(frozen=True)
class ParsedAddress:
    raw: str
    key: str
    uuid: str | None
    ref: str | None
    name_ref: tuple[str, str] | None


def validate_address(to: str) -> str:
    """Reject addresses that are never valid, whoever is registered. Returns the trimmed address."""
    if not isinstance(to, str) or not to.strip():
        raise Invalid("empty_target", "Say who the message is for: `to` is empty.")
    target = to.strip()
    if target == "*":
        raise Invalid(
            "broadcast", "Broadcast (`*`) is not supported; send to each recipient by name, one at a time."
        )
    if "@" in target:
        raise Invalid(
            "at_in_address",
            "Addresses contain no `@`: use the recipient's name, `name [ref]`, ref or id.",
            hint=LIST_AGENTS,
        )
    if len(target) > 300:
        raise Invalid("address_too_long", "That address is longer than any session name or id (300 chars).")
    return target


def parse_address(target: str) -> ParsedAddress:
    """Split an address into the forms the resolver tries, so a caller can fetch just those rows."""
    try:
        as_uuid = str(uuid.UUID(target))
    except ValueError:
        as_uuid = None
    match = _NAME_REF.match(target)
    name_ref = (match.group("name"), match.group("ref").lower()) if match else None
    ref = target.lower() if target.isalnum() else None
    return ParsedAddress(raw=target, key=normalize_name(target), uuid=as_uuid, ref=ref, name_ref=name_ref)


def _one(matches: list[Candidate], rule: str, what: str, pin_key: str | None) -> Resolution | None:
    if not matches:
        return None
    if len(matches) > 1:
        shown = sorted(matches, key=lambda c: c.ref)[:MAX_CANDIDATES_SHOWN]
        raise Ambiguous(
            f"{len(matches)} sessions match {what}; send again to one of them as `name [ref]`.",
            candidates=[{"name": c.name, "ref": c.ref, "cwd": c.cwd, "id": c.id} for c in shown],
        )
    return Resolution(matches[0], rule, pin_key)


def resolve(
    target: str | ParsedAddress,
    candidates: Sequence[Candidate],
    *,
    lead: Candidate | None = None,
    prefixes: bool = True,
) -> Resolution:
    """Pick exactly one recipient for `target` (an address, or one `parse_address` already split)
    among `candidates` (the live sessions), or raise. Without `prefixes`, only an address that
    names a session exactly (rules 1-5) resolves."""
    address = target if isinstance(target, ParsedAddress) else parse_address(target)
    target = address.raw
    if address.key == LEAD_ALIAS:
        if lead is None:
            raise NotFound("`lead` means your team lead, and you are not a teammate in any team.")
        return Resolution(lead, "lead", None)

    if address.uuid:
        found = [c for c in candidates if c.id == address.uuid]
        if found:
            return Resolution(found[0], "id", None)
    if address.ref:
        found = [c for c in candidates if c.ref == address.ref]
        if found:
            return Resolution(found[0], "ref", None)

    exact = _one([c for c in candidates if c.name == target], "name", f"the name {target!r}", address.key)
    if exact:
        return exact

    if address.name_ref:
        name, ref = address.name_ref
        by_ref = [c for c in candidates if c.ref == ref]
        if not by_ref:
            raise NotFound(f"No live session has the ref [{ref}].", hint=LIST_AGENTS)
        if by_ref[0].name_key != normalize_name(name):
            raise NotFound(
                f"The session [{ref}] is named {by_ref[0].name!r}, not {name!r}; check the address."
            )
        return Resolution(by_ref[0], "name_ref", normalize_name(name))

    normalized = _one(
        [c for c in candidates if c.name_key == address.key],
        "normalized",
        f"the name {target!r}",
        address.key,
    )
    if normalized:
        return normalized

    if prefixes and len(address.key) >= MIN_PREFIX:
        prefixed = _one(
            [c for c in candidates if c.name_key.startswith(address.key)],
            "prefix",
            f"the prefix {target!r}",
            address.key,
        )
        if prefixed:
            return prefixed

    note = (
        ""
        if len(address.key) >= MIN_PREFIX or not prefixes
        else f" (prefixes need at least {MIN_PREFIX} characters)"
    )
    raise NotFound(f"No live session is called {target!r}{note}.", hint=LIST_AGENTS)
