"""Session names: what is allowed, and the key they are matched by.

Names are labels people and models read, so they are validated strictly (no control, invisible,
bidi-control or tag characters, which could make two different names look alike or reorder the
marker line) and matched by NFKC + casefold with runs of white space folded to one space.
"""

from __future__ import annotations

import re
import unicodedata

MAX_NAME_CHARS = 64
# Characters a name may contain besides letters, digits and combining marks.
NAME_PUNCTUATION = frozenset(" -_.")
_SPACES = re.compile(r"\s+")

# Unicode general categories never allowed anywhere in names (and stripped from message text):
# control, format (zero-width, bidi controls, tags), separators other than space, private use, unassigned.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"})
_TEXT_KEEP = frozenset("\n\t\r")


def is_invisible(char: str) -> bool:
    """True for characters that render as nothing or reorder text (zero-width, bidi, tag, control)."""
    return unicodedata.category(char) in _FORBIDDEN_CATEGORIES


def normalize_name(name: str) -> str:
    """The matching key of a name: NFKC, casefolded, trimmed, inner white space folded to one space."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return _SPACES.sub(" ", folded).strip()


def name_problem(name: str) -> str | None:
    """Why `name` is not an acceptable session name, or None when it is."""
    if not isinstance(name, str) or not name.strip():
        return "A name must have at least one visible character."
    nfkc = unicodedata.normalize("NFKC", name).strip()
    if len(nfkc) > MAX_NAME_CHARS:
        return f"A name may have at most {MAX_NAME_CHARS} characters."
    for char in nfkc:
        if is_invisible(char) or (char.isspace() and char != " "):
            return f"A name may not contain invisible or control characters (U+{ord(char):04X})."
        category = unicodedata.category(char)
        if category[0] in "LNM" or char in NAME_PUNCTUATION:
            continue
        return f"A name may contain letters, digits, spaces and - _ . only, not {char!r}."
    if unicodedata.category(nfkc[0])[0] == "M":
        return "A name may not start with a combining mark."
    return None


def clean_name(name: str) -> str:
    """The name as it is stored and shown: NFKC, trimmed, inner white space folded."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", name)).strip()


# The only invisible characters in ASCII: the controls other than tab, newline and carriage return.
_ASCII_INVISIBLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BEYOND_ASCII = re.compile(r"[^\x00-\x7f]")


def _visible_or_nothing(found: re.Match[str]) -> str:
    return "" if is_invisible(found.group()) else found.group()


def strip_invisible(text: str) -> tuple[str, int]:
    """Remove invisible, bidi-control and tag characters from message text (keeping newlines and
    tabs). Returns the cleaned text and how many characters were removed.

    Asking a character's category is the costly step, so an ASCII text, whose only invisible
    characters are controls, is cleaned by one regex pass; in a text with a few characters beyond
    ASCII (an em dash, a quote mark) only those are asked; a text mostly beyond ASCII has every
    character asked."""
    if text.isascii():
        cleaned = _ASCII_INVISIBLE.sub("", text)
    elif len(text.encode("utf-8", "surrogatepass")) > 1.25 * len(text):  # mostly beyond ASCII
        cleaned = "".join([c for c in text if c in _TEXT_KEEP or not is_invisible(c)])
    else:
        cleaned = _BEYOND_ASCII.sub(_visible_or_nothing, _ASCII_INVISIBLE.sub("", text))
    return cleaned, len(text) - len(cleaned)
