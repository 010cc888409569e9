"""Where the agent side finds its hub, its enrollment key, its name and its saved sessions.

Read from the environment (and `$SWITCHBOARD_HOME`), never from Django settings, so that a hook or
an MCP server can run on a machine with no hub at all:

- `SWITCHBOARD_URL`: the hub (default http://127.0.0.1:8765);
- `SWITCHBOARD_ENROLL_KEY`, else `$SWITCHBOARD_HOME/enroll.key`: the key that registers sessions;
- `SWITCHBOARD_NAME`, else the working folder's name: the session's name;
- `SWITCHBOARD_TOKEN`: act as an already registered session instead of registering one.

Saved sessions (one per Claude Code session id) live in `$SWITCHBOARD_HOME/sessions/`, mode 0600.
"""

from __future__ import annotations

import json
import os
import re
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from console.home import home_dir, write_private

DEFAULT_URL = "http://127.0.0.1:8765"
# Words that mean something else in an address (the hub refuses them as names).
RESERVED_NAMES = frozenset({"lead", "hub", "operator", "switchboard"})
SESSION_ID_CHARS = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def hub_url() -> str:
    return (os.environ.get("SWITCHBOARD_URL") or DEFAULT_URL).strip().rstrip("/")


def enroll_key() -> str | None:
    """The enrollment key from the environment or the hub's home folder; None when neither has one."""
    key = os.environ.get("SWITCHBOARD_ENROLL_KEY", "").strip()
    if key:
        return key
    try:
        return (home_dir() / "enroll.key").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def session_name(cwd: str | None = None) -> str:
    """SWITCHBOARD_NAME, else the folder's name, cleaned to what the hub accepts in a name:
    letters (any script), digits, space and - _ . ; a reserved address word gets `-agent` added."""
    raw = os.environ.get("SWITCHBOARD_NAME", "").strip() or Path(cwd or os.getcwd()).name
    nfkc = unicodedata.normalize("NFKC", raw)
    kept = "".join(c if unicodedata.category(c)[0] in "LN" or c in " ._-" else "-" for c in nfkc)
    cleaned = re.sub(r"-{2,}", "-", kept).strip(" .-_")[:58]
    if not cleaned:
        return "agent"
    return f"{cleaned}-agent" if cleaned.casefold() in RESERVED_NAMES else cleaned


def sessions_dir() -> Path:
    path = home_dir() / "sessions"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@dataclass
class SavedSession:
    """What a hook or MCP server keeps between calls: who it is on the hub, and its token."""

    key: str  # the Claude Code session id (or another caller-chosen key)
    hub: str
    token: str
    id: str
    name: str
    ref: str
    cwd: str = ""
    status: str = "busy"  # the last status this client reported
    ended: bool = False
    # A pull's answer was lost (hub error or dropped connection): the next pull, by whichever hook
    # process runs next, also asks for messages handed over but not acked (see HubClient.inbox).
    pull_unsettled: bool = False
    saved_at: float = field(default_factory=time.time)


def _session_path(key: str) -> Path:
    if not SESSION_ID_CHARS.match(key):
        raise ValueError("A session key takes 1 to 128 letters, digits, dots, dashes or underscores.")
    return sessions_dir() / f"{key}.json"


def session_save(saved: SavedSession) -> None:
    """Write the saved session (0600, atomically)."""
    saved.saved_at = time.time()
    write_private(_session_path(saved.key), json.dumps(asdict(saved)))


def session_load(key: str) -> SavedSession | None:
    try:
        data: dict[str, Any] = json.loads(_session_path(key).read_text(encoding="utf-8"))
        return SavedSession(**data)
    except (OSError, ValueError, TypeError):
        return None


def session_forget(key: str) -> None:
    _session_path(key).unlink(missing_ok=True)


def session_for_cwd(cwd: str, hub: str) -> SavedSession | None:
    """The newest live saved session for this folder and hub (how an MCP server finds the session
    its Claude Code hooks registered), or None."""
    best: SavedSession | None = None
    for path in sessions_dir().glob("*.json"):
        saved = session_load(path.stem)
        if saved is None or saved.ended or saved.cwd != cwd or saved.hub != hub:
            continue
        if best is None or saved.saved_at > best.saved_at:
            best = saved
    return best


def log_path() -> Path:
    return home_dir() / "agent.log"
