"""What makes a message sensitive: one readable table of patterns, and the classifier.

A message is `sensitive` when its text carries credential-like material, a destructive command,
or a request for another session's transcript, or when its signature check failed. Sensitive
messages are held for a human with escalate=required (see `messaging.policy`). Every pattern is
bounded (no nested unbounded repeats), so scanning a 1 MB message stays linear.

Each row has tests of its own in tests/messaging/test_sensitivity.py, with near misses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from messaging.models import MessageKind, Tier


@dataclass(frozen=True)
class Pattern:
    name: str
    category: str  # "credential" | "destructive" | "transcript"
    regex: re.Pattern[str]
    why: str
    # Substrings of which every match holds at least one (lowercase when the pattern ignores case,
    # looked for in `lowered_for_needs(text)`). A text holding none of them cannot match, and `in`
    # finds that out 10-20 times faster than the regex: a leading \b keeps Python's engine from
    # skipping ahead to a literal.
    needs: tuple[str, ...]
    ignores_case: bool  # the regex's IGNORECASE, kept as a bool: testing the flag costs more than `in`


def _p(name: str, category: str, regex: str, why: str, flags: int = 0, *, needs: tuple[str, ...]) -> Pattern:
    return Pattern(name, category, re.compile(regex, flags), why, needs, bool(flags & re.IGNORECASE))


I = re.IGNORECASE  # noqa: E741

PATTERNS: tuple[Pattern, ...] = (
    # --- credentials and keys -------------------------------------------------------------------
    _p(
        "private_key_block",
        "credential",
        r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----",
        "PEM private key",
        needs=("PRIVATE KEY",),
    ),
    _p(
        "aws_access_key",
        "credential",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        "AWS access key id",
        needs=("AKIA", "ASIA"),
    ),
    _p(
        "github_token",
        "credential",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
        "GitHub token",
        needs=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _p(
        "llm_api_key",
        "credential",
        r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,200}",
        "OpenAI / Anthropic style API key",
        needs=("sk-",),
    ),
    _p("slack_token", "credential", r"\bxox[abprs]-[A-Za-z0-9-]{10,200}", "Slack token", needs=("xox",)),
    _p("google_api_key", "credential", r"\bAIza[0-9A-Za-z_-]{35}\b", "Google API key", needs=("AIza",)),
    _p(
        "stripe_secret_key",
        "credential",
        r"\b[rs]k_live_[0-9A-Za-z]{16,200}",
        "Stripe live secret key",
        needs=("k_live_",),
    ),
    _p(
        "switchboard_token",
        "credential",
        r"\bsb[so]_[A-Za-z0-9_-]{40,60}",
        "a Switchboard session or operator token",
        needs=("sbs_", "sbo_"),
    ),
    _p(
        "jwt",
        "credential",
        r"\beyJ[A-Za-z0-9_-]{8,2000}\.eyJ[A-Za-z0-9_-]{8,4000}\.[A-Za-z0-9_-]{8,2000}",
        "JSON Web Token",
        needs=("eyJ",),
    ),
    _p(
        "bearer_header",
        "credential",
        r"\bauthorization:\s{0,5}bearer\s{1,5}[A-Za-z0-9._~+/=-]{16,500}",
        "Authorization header",
        I,
        needs=("authorization:",),
    ),
    _p(
        "secret_assignment",
        "credential",
        r"\b(?:password|passwd|pwd|passphrase|secret|client[_-]?secret|api[_-]?key|access[_-]?token|auth[_-]?token)"
        r"\s{0,3}[:=]\s{0,3}[\"']?[^\s\"'<>{}]{4,200}",
        "password=, api_key:, secret= with a value",
        I,
        needs=("pass", "pwd", "secret", "api", "token"),
    ),
    _p(
        "url_with_password",
        "credential",
        r"\b[a-z][a-z0-9+.-]{1,20}://[^\s/:@]{1,100}:[^\s/@]{1,200}@",
        "URL with user:password@",
        I,
        needs=("://",),
    ),
    # --- destructive commands -------------------------------------------------------------------
    _p(
        "rm_recursive_force",
        "destructive",
        r"\brm\s{1,5}(?:-[A-Za-z]{0,5}(?:r[A-Za-z]{0,5}f|f[A-Za-z]{0,5}r)[A-Za-z]{0,5}\b|(?:-[rRf]\s{1,5}-[rRf]\b)"
        r"|--recursive\s{1,5}--force\b|--force\s{1,5}--recursive\b)",
        "rm -rf and its spellings",
        I,
        needs=("rm",),
    ),
    _p(
        "git_force_push",
        "destructive",
        r"\bgit\s{1,5}push\b[^\n;&|]{0,200}?(?:\s--force(?:-with-lease)?\b|\s-f\b|\s\+[\w./-]{1,200})",
        "git push --force / -f / +refspec",
        needs=("push",),
    ),
    _p(
        "git_reset_hard",
        "destructive",
        r"\bgit\s{1,5}reset\s{1,5}--hard\b",
        "git reset --hard",
        needs=("--hard",),
    ),
    _p(
        "sql_drop",
        "destructive",
        r"\bdrop\s{1,5}(?:table|database|schema)\b",
        "DROP TABLE / DATABASE / SCHEMA",
        I,
        needs=("drop",),
    ),
    _p("sql_truncate", "destructive", r"\btruncate\s{1,5}table\b", "TRUNCATE TABLE", I, needs=("truncate",)),
    _p(
        "mkfs",
        "destructive",
        r"\bmkfs(?:\.[a-z0-9]{1,10})?\s",
        "formatting a file system",
        I,
        needs=("mkfs",),
    ),
    _p(
        "dd_to_device",
        "destructive",
        r"\bdd\s[^\n]{0,200}?\bof=/dev/",
        "dd writing to a device",
        needs=("of=/dev/",),
    ),
    _p(
        "redirect_to_disk",
        "destructive",
        r">\s{0,3}/dev/(?:sd[a-z]|nvme\d|hd[a-z]|vd[a-z]|disk\d)",
        "writing over a disk",
        needs=("/dev/",),
    ),
    _p(
        "fork_bomb",
        "destructive",
        r":\(\)\s{0,3}\{\s{0,3}:\s{0,3}\|\s{0,3}:\s{0,3}&\s{0,3}\}\s{0,3};\s{0,3}:",
        "fork bomb",
        needs=(":()",),
    ),
    # --- transcript requests --------------------------------------------------------------------
    _p(
        "transcript_request",
        "transcript",
        r"\b(?:send|share|paste|give|show|dump|forward|export|print|copy|reveal|tell)\b[^.\n?!]{0,40}?"
        r"\b(?:your|its|their|his|her|the other session'?s?|another session'?s?)\s{1,3}(?:full\s|entire\s|whole\s)?"
        r"(?:transcript|conversation history|chat history|session log|conversation log|system prompt|context window)",
        "asks for a session's transcript, history or system prompt",
        I,
        needs=(
            "transcript",
            "conversation history",
            "chat history",
            "session log",
            "conversation log",
            "system prompt",
            "context window",
        ),
    ),
)


@dataclass(frozen=True)
class Classification:
    tier: str
    matches: tuple[str, ...] = ()  # names of the patterns that matched (never the matched text)


def lowered_for_needs(text: str) -> str:
    """`text` lowercased, to look for the needs of the patterns that ignore case: `str.lower`, and
    the four characters beyond ASCII that such matching takes for an ASCII letter made into that
    letter (İ and ı for i, ſ for s; the Kelvin sign K already lowers to k)."""
    lowered = text.lower()
    if not text.isascii():
        lowered = lowered.replace("i\u0307", "i").replace("\u0131", "i").replace("\u017f", "s")
    return lowered


def sensitive_matches(text: str) -> tuple[str, ...]:
    """Names of every pattern in the table that `text` matches; a pattern whose `needs` the text
    lacks is skipped without running its regex."""
    lowered = lowered_for_needs(text)
    found = []
    for pattern in PATTERNS:
        within = lowered if pattern.ignores_case else text
        for needed in pattern.needs:
            if needed in within:
                if pattern.regex.search(text):
                    found.append(pattern.name)
                break
    return tuple(found)


def classify(
    text: str,
    *,
    kind: str = MessageKind.TEXT,
    signature_failed: bool = False,
    declared_sensitive: bool = False,
) -> Classification:
    """The tier of a message: sensitive (table match, failed signature, or declared), coord (a team
    protocol frame), else info."""
    matches = sensitive_matches(text)
    if signature_failed:
        matches = ("signature_failed", *matches)
    if declared_sensitive:
        matches = ("declared", *matches)
    if matches:
        return Classification(Tier.SENSITIVE, matches)
    if kind == MessageKind.FRAME:
        return Classification(Tier.COORD)
    return Classification(Tier.INFO)
