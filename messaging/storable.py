"""Text the database can store: no NUL character (PostgreSQL's text cannot hold one; SQLite would
keep it and hand it on) and valid Unicode (no lone surrogate). Every way text comes in from outside
is checked against this one rule before anything is written: the API's JSON bodies and query
strings (`hub.api`) and hub-to-hub bodies (`federation.transport.hub_json`)."""

from __future__ import annotations

from typing import Any


def unstorable_text(value: Any) -> str | None:
    """Why `value` (parsed JSON: strings, numbers, lists and objects, nested) holds text the
    database cannot store, as a sentence; None when all of it can be stored."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "Text may not contain NUL characters."
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "Text must be valid Unicode (it holds a lone surrogate)."
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None
