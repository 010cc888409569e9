"""What makes a message sensitive, and how a secret is shown to an operator: masked.

A message is `sensitive` when its text, its summary or a text-like attached file carries
credential-like material, a destructive command or a request for another session's transcript
(the table in `messaging.sensitivity_rules`), or when its signature check failed. Sensitive
messages are held for a human with escalate=required (see `messaging.policy`).

`classify` runs on every send, so the common case (nothing matches) costs one lowercasing and a
few dozen substring checks; the regexes run only for rules whose `needs` the text holds, and
the findings (spans, masked hints) are worked out only for a text that matched.

Operators never see a matched secret by default: `mask_text` replaces each secret with the rule's
label and a few of its characters (`[AWS secret access key wJal…EKEY]`). Revealing is an explicit,
audited action (messaging.services.holds.message_reveal). The recipient gets the text as sent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from messaging.models import MessageKind, Tier
from messaging.sensitivity_rules import CREDENTIAL, IN_TOKEN_RUNS, RULES, TOKEN_RUN, Rule

# Attached files: a file is text-like when its first 8 KiB hold no NUL byte; its first
# FILE_SCAN_BYTES are scanned (a secret further in a larger file is not looked for).
FILE_SCAN_BYTES = 1024 * 1024
_BINARY_PROBE = 8192
# What a masked secret keeps: 4 characters at each end of a long one, 2 of a shorter one, none of
# a short one (a short password with 8 characters shown would be no secret).
_MASK_LONG, _MASK_SHORT = 24, 12
# Markers in where a finding was made (stored with the message: "name", "name@summary", "name@file").
TEXT, SUMMARY, FILE = "text", "summary", "file"
RULES_BY_NAME = {rule.name: rule for rule in RULES}
SIGNATURE_FAILED, DECLARED = "signature_failed", "declared"
EXTRA_LABELS = {
    SIGNATURE_FAILED: "the sending hub's signature did not verify",
    DECLARED: "declared sensitive",
}


@dataclass(frozen=True)
class Finding:
    """One match: the rule, where it was found, and the span of what must be masked."""

    rule: Rule
    start: int
    end: int
    where: str = TEXT
    hint: str = ""  # the masked form, e.g. "wJal…EKEY" (never more of the secret)

    @property
    def masked(self) -> str:
        return f"[{self.rule.label}{' ' + self.hint if self.hint else ''}]"

    @property
    def described(self) -> str:
        """The finding in words for an operator and the audit: label, where, masked hint."""
        where = "" if self.where == TEXT else f" (in the {self.where})"
        return f"{self.rule.label}{where}{' ' + self.hint if self.hint else ''}"


@dataclass(frozen=True)
class Classification:
    tier: str
    # Codes of what matched: rule names, with "@summary" / "@file" when not in the text, plus
    # "signature_failed" / "declared". Never the matched text.
    matches: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()  # with masked hints, for the audit (only when sensitive)


def lowered_for_needs(text: str) -> str:
    """`text` lowercased, to look for the needs of the rules that ignore case: `str.lower`, and
    the characters beyond ASCII that such matching takes for an ASCII letter made into that
    letter (İ and ı for i, ſ for s; the Kelvin sign K already lowers to k)."""
    lowered = text.lower()
    if not text.isascii():
        lowered = lowered.replace("i\u0307", "i").replace("\u0131", "i").replace("\u017f", "s")
    return lowered


@dataclass(frozen=True)
class _Plan:
    """A rule as the scanner runs it: its needles keyed by the case they are looked for in."""

    rule: Rule
    needles: frozenset[tuple[bool, str]]  # (where to look: 0 text, 1 lowered, 2 token runs; needle)
    leads: dict[str, tuple[int, re.Pattern[str]]]


_PLANS = tuple(
    _Plan(
        rule,
        frozenset(
            (2 if rule.name in IN_TOKEN_RUNS else int(rule.ignores_case), needle) for needle in rule.needs
        ),
        {needle: (most, lead) for needle, most, lead in rule.leads},
    )
    for rule in RULES
)
# Every needle once: a text is searched for each a single time, whatever rules share it.
_NEEDLES = tuple(sorted({needle for plan in _PLANS for needle in plan.needles if needle[0] != 2}))
_RUN_NEEDLES = tuple(sorted({needle for plan in _PLANS for needle in plan.needles if needle[0] == 2}))


def _needle_places(rule: Rule, within: str, found: frozenset[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(position, needle) of each place a needle of `rule` occurs in `within` (where the rule's
    `locate` regex says, when it has one)."""
    if rule.locate is not None:
        for located in rule.locate.finditer(within):
            yield located.start(), located.group()
        return
    for _where, needed in found:
        at = within.find(needed)
        while at != -1:
            yield at, needed
            at = within.find(needed, at + 1)


def _rule_matches(text: str) -> Iterator[tuple[Rule, re.Match[str]]]:
    """Every match of every rule in `text`, rule by rule in table order. A rule whose needs the
    text lacks is skipped; otherwise its regex is tried only where a match can start: up to
    `rule.back` characters before each place a needle occurs, or where its lead begins (or over
    the whole text, for a rule whose needle may be anywhere in a match)."""
    if not text:
        return
    lowered = lowered_for_needs(text)
    aligned = len(lowered) == len(text)  # a position in the lowered text is one in the text
    present = {(folded, needle) for folded, needle in _NEEDLES if needle in (lowered if folded else text)}
    runs = " ".join(TOKEN_RUN.findall(text))
    if runs:
        present.update(needle for needle in _RUN_NEEDLES if needle[1] in runs)
    if not present:
        return
    for plan in _PLANS:
        found = plan.needles & present
        if not found:
            continue
        rule = plan.rule
        if rule.back is None or (rule.ignores_case and not aligned):
            yield from ((rule, m) for m in rule.regex.finditer(text))
            continue
        within = lowered if rule.ignores_case else text
        starts: set[int] = set()
        for at, needed in _needle_places(rule, within, found):
            most, lead = plan.leads.get(needed, (0, None))
            if lead is not None:
                led = lead.search(within, max(0, at - most), at)
                if led is not None:
                    starts.add(led.start())
            elif rule.back:
                starts.update(range(max(0, at - rule.back), at + 1))
            else:
                starts.add(at)
        matched_to = -1
        for start in sorted(starts):
            if start < matched_to:
                continue
            match = rule.regex.match(text, start)
            if match is not None:
                matched_to = max(match.end(), start + 1)
                yield rule, match


# --- telling a secret from a reference to one ---------------------------------------------------

_PLACEHOLDERS = frozenset(
    [
        "password",
        "passwd",
        "pass",
        "secret",
        "token",
        "key",
        "apikey",
        "api_key",
        "none",
        "null",
        "nil",
        "undefined",
        "true",
        "false",
        "yes",
        "no",
        "changeme",
        "change_me",
        "redacted",
        "hidden",
        "masked",
        "required",
        "optional",
        "empty",
        "string",
        "str",
        "bytes",
        "int",
        "bool",
        "number",
        "any",
        "secretstr",
        "text",
        "value",
        "example",
        "sample",
        "dummy",
        "placeholder",
        "env",
        "environ",
        "getenv",
        "todo",
        "tbd",
        "fixme",
        "not_set",
        "unset",
        "notset",
        "default",
        "omitted",
    ]
)
_PLACEHOLDER_PARTS = (
    "example",
    "your_",
    "your-",
    "yourpass",
    "placeholder",
    "redacted",
    "...",
    "xxxx",
    "****",
    "<",
    ">",
    "dummy",
    "changeme",
)
_REFERENCE_START = tuple("$%<{[(@*&#\\!")
_DOTTED = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+")
_IDENT = re.compile(r"[A-Za-z_]\w*")
# A name ending in one of these holds something about a secret, not the secret itself.
_NOT_SECRET_SUFFIXES = frozenset(
    [
        "count",
        "len",
        "length",
        "limit",
        "limits",
        "type",
        "name",
        "names",
        "file",
        "path",
        "env",
        "var",
        "field",
        "id",
        "url",
        "uri",
        "endpoint",
        "expiry",
        "expires",
        "expiration",
        "ttl",
        "timeout",
        "header",
        "prefix",
        "hash",
        "hashed",
        "hasher",
        "rotation",
        "policy",
        "min",
        "max",
        "size",
        "mode",
        "format",
        "version",
        "required",
        "reset",
        "at",
        "enabled",
        "disabled",
        "enable",
        "disable",
        "set",
        "source",
        "store",
        "provider",
        "kind",
        "label",
        "hint",
        "help",
        "ref",
        "len",
        "regex",
        "pattern",
        "param",
        "params",
        "arg",
        "args",
        "index",
        "idx",
        "key_id",
        "id_key",
    ]
)


def _entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    counts: dict[str, int] = {}
    for char in value:
        counts[char] = counts.get(char, 0) + 1
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def value_is_secret(value: str, *, quoted: bool, op: str = "=", prose: bool = False) -> bool:
    """True when an assigned or quoted value looks like a secret itself rather than a reference to
    one (`$DB_PASSWORD`, `os.environ["X"]`, `settings.SECRET_KEY`, `${{ secrets.X }}`), a
    placeholder (`<your-token>`, `changeme`, `****`), a type (`token: str`) or a plain word
    (`password: required`)."""
    value = value.strip().rstrip(".,;)}]")
    if len(value) < 4:
        return False
    lowered = value.lower()
    if value.startswith(_REFERENCE_START) or "${" in value or "{{" in value or "(" in value or "[" in value:
        return False
    if lowered in _PLACEHOLDERS or any(part in lowered for part in _PLACEHOLDER_PARTS):
        return False
    if len(set(value)) <= 2:  # xxxx, ****, aaaa1
        return False
    if value.isdigit() and len(value) <= 8:  # a count, a port, a size
        return False
    has_digit = any(c.isdigit() for c in value)
    has_symbol = any(not c.isalnum() for c in value)
    if prose:
        # "my password is hunter2", "... is correcthorsebatterystaple", never "is incorrect".
        return has_digit or (has_symbol and not value.replace("-", "").isalpha()) or len(value) >= 16
    if quoted:
        return not (_IDENT.fullmatch(value) and op == ":" and not has_digit and value[0].isupper())
    if _DOTTED.fullmatch(value) and not has_digit:
        return False  # settings.SECRET_KEY, self.password, process.env.TOKEN
    if _IDENT.fullmatch(value) and not has_digit:
        if op != "=":
            return False  # YAML / type hints / prose after a colon: `auth: required`, `token: string`
        # `password=new_password`, `token=accessToken`: a name in code; `DB_PASS=hunter` stays.
        return not ("_" in value or (value[0].islower() and any(c.isupper() for c in value)))
    return True


def _name_is_about_a_secret(name: str) -> bool:
    """`DB_PASSWORD` holds a secret; `PASSWORD_MIN_LENGTH`, `token_count`, `secret_name` do not."""
    last = re.split(r"[_.-]", name.lower())[-1]
    return last not in _NOT_SECRET_SUFFIXES


# The environment-style NAME right before a high-entropy value's `=`.
_NAME_BEFORE = re.compile(r"(?<![A-Za-z0-9_])([A-Z][A-Z0-9_]{2,60})\s{0,3}$")
_HASHY_NAME = re.compile(
    r"SHA|HASH|DIGEST|CHECKSUM|COMMIT|REV|ETAG|INTEGRITY|UUID|(?:^|_)IDS?$|VERSION|PATH|URL|HOST|DIR|FILE|IMAGE|NONCE|SALT_ROUNDS"
)


def _accepted(rule: Rule, match: re.Match[str], text: str) -> tuple[int, int] | None:
    """The span to mask when `match` is a real finding of `rule`, else None."""
    groups = match.groupdict()
    span_group = next(
        (
            g
            for g in ("secret", "secret2", "secret3", "secret4", "secret5", "dq", "sq", "bq", "bare")
            if groups.get(g)
        ),
        None,
    )
    if span_group is None:
        start, end = match.span()
    else:
        start, end = match.span(span_group)
    if rule.to_block_end:
        closing = text.find("-----END", match.end(), match.end() + 20000)
        end = closing if closing != -1 else min(len(text), match.end() + 20000)
        start = match.end()
        return start, end
    if not rule.checks_value and not rule.min_entropy:
        return start, end
    value = text[start:end]
    if rule.name == "secret_assignment":
        if not _name_is_about_a_secret(groups["name"]):
            return None
        op = groups["op"]
        quoted = span_group in ("dq", "sq", "bq")
        if not quoted and op == ":" and not _ends_its_line(text, end):
            return None  # "password: reset link sent" is prose, not YAML
        return (start, end) if value_is_secret(value, quoted=quoted, op=op) else None
    if rule.name == "high_entropy_assignment":
        name = _NAME_BEFORE.search(text, max(0, match.start() - 70), match.start())
        if name is None or _HASHY_NAME.search(name.group(1)) or value.startswith(("/", "./", "../")):
            return None
        letters_digits = any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
        if not letters_digits or _entropy(value) < rule.min_entropy:
            return None
        return (start, end) if value_is_secret(value, quoted=False) else None
    if rule.name == "password_in_prose":
        return (start, end) if value_is_secret(value, quoted=False, prose=True) else None
    return (start, end) if value_is_secret(value, quoted=True) else None


def _ends_its_line(text: str, end: int) -> bool:
    rest = text[end : end + 200].split("\n", 1)[0].strip()
    return not rest or rest.startswith(("#", "//", ",", "}", "]"))


def _hint(secret: str) -> str:
    secret = secret.strip()
    if len(secret) >= _MASK_LONG:
        return f"{secret[:4]}…{secret[-4:]}"
    if len(secret) >= _MASK_SHORT:
        return f"{secret[:2]}…{secret[-2:]}"
    return "…"


def findings(text: str, *, where: str = TEXT) -> list[Finding]:
    """Every finding in `text`, in order, one per span (where two rules match the same secret,
    the earlier rule in the table, the more specific one, names it)."""
    found: list[Finding] = []
    for rule, match in _rule_matches(text):
        span = _accepted(rule, match, text)
        if span is None:
            continue
        start, end = span
        if any(f.start < end and start < f.end for f in found):
            continue
        hint = _hint(text[start:end]) if rule.category == CREDENTIAL and not rule.to_block_end else ""
        found.append(Finding(rule, start, end, where, hint))
    return sorted(found, key=lambda f: f.start)


def sensitive_matches(text: str) -> tuple[str, ...]:
    """Names of every rule that `text` matches, in table order."""
    names = {f.rule.name for f in findings(text)}
    return tuple(rule.name for rule in RULES if rule.name in names)


def file_text(data: bytes) -> str | None:
    """The scanned part of an attached file as text, or None when it is binary."""
    if b"\x00" in data[:_BINARY_PROBE]:
        return None
    return data[:FILE_SCAN_BYTES].decode("utf-8", errors="replace")


def classify(
    text: str,
    *,
    summary: str = "",
    files: Iterable[bytes] = (),
    kind: str = MessageKind.TEXT,
    signature_failed: bool = False,
    declared_sensitive: bool = False,
) -> Classification:
    """The tier of a message: sensitive (a finding in its text, summary or a text-like file; a
    failed signature; or declared), coord (a team protocol frame, whose JSON is scanned as text),
    else info."""
    found = findings(text)
    if summary:
        found += findings(summary, where=SUMMARY)
    for data in files:
        content = file_text(data)
        if content:
            found += findings(content, where=FILE)
    codes = list(dict.fromkeys(f.rule.name if f.where == TEXT else f"{f.rule.name}@{f.where}" for f in found))
    if signature_failed:
        codes.insert(0, SIGNATURE_FAILED)
    if declared_sensitive:
        codes.insert(0, DECLARED)
    if codes:
        return Classification(Tier.SENSITIVE, tuple(codes), tuple(found))
    if kind == MessageKind.FRAME:
        return Classification(Tier.COORD)
    return Classification(Tier.INFO)


# --- what an operator sees ------------------------------------------------------------------------


def secrets_in(text: str) -> list[Finding]:
    """The findings in `text` that are credentials (not destructive commands or transcript
    requests), in order."""
    return [f for f in findings(text) if f.rule.category == CREDENTIAL]


def mask_text(text: str) -> str:
    """`text` with every matched secret replaced by its rule's label and a few of its characters.
    Destructive commands and transcript requests stay readable: they are what the operator judges."""
    secrets = secrets_in(text)
    if not secrets:
        return text
    out, at = [], 0
    for finding in secrets:
        out.append(text[at : finding.start])
        out.append(finding.masked)
        at = finding.end
    out.append(text[at:])
    return "".join(out)


# A secret that starts within a preview but ends beyond it is masked whole: the preview is cut
# from the masked text, which is masked over this much more than the preview shows.
_PREVIEW_MARGIN = 8192


def mask_preview(text: str, length: int) -> str:
    """The first `length` characters an operator sees of `text`, masked (see `mask_text`)."""
    return mask_text(text[: length + _PREVIEW_MARGIN])[:length]


def match_labels(codes: Sequence[str] | str) -> list[str]:
    """What matched, in words, from the codes stored with a message ("aws_secret_key@summary" →
    "AWS secret access key (in the summary)"), each once."""
    if isinstance(codes, str):
        codes = codes.split()
    labels = []
    for code in codes:
        name, _, where = code.partition("@")
        rule = RULES_BY_NAME.get(name)
        label = rule.label if rule else EXTRA_LABELS.get(name, name.replace("_", " "))
        labels.append(f"{label} (in the {where})" if where else label)
    return list(dict.fromkeys(labels))
