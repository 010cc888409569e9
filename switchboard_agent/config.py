"""Where the agent side finds its hub, its enrollment key, its name and its saved sessions.

Read from the environment (and `$SWITCHBOARD_HOME`), never from Django settings, so that a hook or
an MCP server can run on a machine with no hub at all:

- `SWITCHBOARD_URL`: the hub (default http://127.0.0.1:8765);
- `SWITCHBOARD_ENROLL_KEY`, else `$SWITCHBOARD_HOME/enroll.key`: the key that registers sessions
  (the file's key only for that home's hub: the address in `hub.url`, or a hub on loopback);
- `SWITCHBOARD_NAME`, else the working folder's name: the session's name;
- `SWITCHBOARD_TOKEN`: act as an already registered session instead of registering one.

Saved sessions (one per agent session: a Claude Code or Gemini CLI session id, or a Codex process)
live in `$SWITCHBOARD_HOME/sessions/`, mode 0600, as `<key>.json`, beside their lock files, the
hooks' breaker and pending registrations (`<key>.pending`: a registration sent whose answer has not
been saved yet, see `switchboard_agent.registration`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from switchboard_agent.home import UnsafeHome, home_dir, private_folder, read_private, write_private

DEFAULT_URL = "http://127.0.0.1:8765"
# Where `switchboard serve` writes the address it listens on (this machine's view of it), in its
# home: the agent side with the same home finds the hub there, whatever port it took.
HUB_URL_FILE = "hub.url"
ENROLL_KEY_FILE = "enroll.key"  # where a hub on this machine keeps its enrollment key
# Words that mean something else in an address (the hub refuses them as names).
RESERVED_NAMES = frozenset({"lead", "hub", "operator", "switchboard"})
SESSION_ID_CHARS = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def hub_url() -> str:
    """The hub: SWITCHBOARD_URL, else the address a hub started with this home wrote there
    (`HUB_URL_FILE`), else DEFAULT_URL."""
    url = os.environ.get("SWITCHBOARD_URL", "").strip()
    if not url:
        try:
            url = read_private(home_dir() / HUB_URL_FILE).strip()
        except OSError:
            url = ""
    return (url or DEFAULT_URL).rstrip("/")


def enroll_key(url: str) -> str | None:
    """The enrollment key for the hub at `url`: SWITCHBOARD_ENROLL_KEY, else the key in the home
    folder when `url` is that home's hub (`hub_of_this_home`); None otherwise."""
    key = os.environ.get("SWITCHBOARD_ENROLL_KEY", "").strip()
    if key:
        return key
    if not hub_of_this_home(url):
        return None
    try:
        return read_private(home_dir() / ENROLL_KEY_FILE).strip() or None
    except OSError:
        return None


def hub_of_this_home(url: str) -> bool:
    """Whether `url` is the hub whose enrollment key this home keeps: the address that hub wrote
    here (`HUB_URL_FILE`), or any hub on this machine's loopback. A key sent elsewhere would let
    that hub's operator, or anyone on the way, register sessions on this one."""
    url = url.strip().rstrip("/")
    with contextlib.suppress(OSError):
        if url == read_private(home_dir() / HUB_URL_FILE).strip().rstrip("/"):
            return True
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    """`$SWITCHBOARD_HOME/sessions`, created 0700; UnsafeHome when another user could write in
    it (one made while the home was open to others keeps its owner and mode)."""
    return private_folder(home_dir() / "sessions", "SWITCHBOARD_HOME/sessions")


@dataclass
class SavedSession:
    """What a hook or MCP server keeps between calls: who it is on the hub, and its token."""

    key: str  # the agent client's current session id (or another caller-chosen key)
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
    # Every session id this hub session has served: Claude Code's /clear and /resume start a new
    # session id in the same process, and the hub session (the ref peers address) carries over.
    keys: list[str] = field(default_factory=list)
    # The agent client process that registered it ("pid:start time", see identity.client_anchor):
    # the tie by which its MCP server, its later session ids and Codex's notify find it.
    anchor: str = ""
    client: str = "claude"
    # The permission mode the hub records for it (`default` or `bypass`), as last heard.
    permission_mode: str = "default"

    @classmethod
    def registered(cls, body: dict[str, Any], *, key: str, hub: str, **fields: Any) -> SavedSession:
        """The saved session for a registration's answer (`POST /sessions`: token, id, name, ref)."""
        fields.setdefault("keys", [key])
        fields.setdefault("permission_mode", body.get("permission_mode", "default"))
        return cls(
            key=key, hub=hub, token=body["token"], id=body["id"], name=body["name"], ref=body["ref"], **fields
        )


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
        data: dict[str, Any] = json.loads(read_private(_session_path(key)))
        return SavedSession(**data)
    except (OSError, ValueError, TypeError):
        return None


def session_forget(key: str) -> None:
    _session_path(key).unlink(missing_ok=True)


def session_set_aside(saved: SavedSession) -> None:
    """Move a saved session left behind off its session id, marked ended: the id is free for the
    session that goes on in its place, and the next registration on this machine ends this one on
    the hub with its own token (`registration.sessions_reap`) and forgets it."""
    old = saved.key
    saved.key = f"left-{os.urandom(4).hex()}-{old}"[:128]
    saved.keys, saved.ended = [saved.key], True
    session_save(saved)
    session_forget(old)


def saved_sessions(hub: str) -> Iterator[SavedSession]:
    """Every saved session on `hub`, ended ones too (an end the hub never heard of)."""
    for path in sessions_dir().glob("*.json"):
        saved = session_load(path.stem)
        if saved is not None and saved.hub == hub:
            yield saved


def live_sessions(hub: str) -> Iterator[SavedSession]:
    """Every saved session on `hub` that has not ended."""
    return (saved for saved in saved_sessions(hub) if not saved.ended)


def session_find(key: str, hub: str) -> SavedSession | None:
    """The live saved session that serves (or once served) the session id `key` on `hub`."""
    saved = session_load(key) if SESSION_ID_CHARS.match(key) else None
    if saved is not None and not saved.ended and saved.hub == hub:
        return saved
    return next((s for s in live_sessions(hub) if key in s.keys), None)


def process_session_key(client: str, anchor: str) -> str:
    """The saved-session key of an agent client that passes its MCP server no session id (Codex):
    its hooks and its MCP server both find the session by the client process they run under."""
    return f"{client}-{anchor.replace(':', '-')}"


def resumed_session_key(key: str, anchor: str) -> str:
    """The saved-session key of session id `key` in agent client process `anchor` when another live
    client process has that id too (one conversation open in two clients: `claude --resume`, or
    `/resume`, of a conversation still running elsewhere): `<key>.<pid>-<start time>`, so each
    process keeps a saved session, and a hub session, of its own."""
    return f"{key[:80]}.{anchor.replace(':', '-')}"[:128]


def sessions_of_process(anchor: str, hub: str) -> list[SavedSession]:
    """The live saved sessions on `hub` registered from the agent client process `anchor`."""
    return [s for s in live_sessions(hub) if s.anchor == anchor] if anchor else []


@dataclass
class PendingRegistration:
    """A registration sent (or about to be) for the saved session `key` whose answer is not saved
    yet. Its `registration_key` (random, 256 bits) lets the next try get the same hub session back
    instead of a second one; the request is resent as it was first made (`name`, `cwd`, ...)."""

    key: str
    hub: str
    registration_key: str
    name: str
    cwd: str = ""
    kind: str = "script"
    permission_mode: str = "default"
    anchor: str = ""  # the agent client process it registers for (see identity.client_anchor)
    peer_address: str = ""  # a listener's socket (`uds:/path`)
    created_at: float = field(default_factory=time.time)


def _pending_path(key: str) -> Path:
    return _session_path(key).with_suffix(".pending")  # not *.json: never read as a saved session


def pending_save(pending: PendingRegistration) -> None:
    """Write the pending registration (0600, atomically) before its request is sent."""
    write_private(_pending_path(pending.key), json.dumps(asdict(pending)))


def pending_load(key: str, hub: str) -> PendingRegistration | None:
    """The pending registration of saved session `key` on `hub`, or None."""
    try:
        data: dict[str, Any] = json.loads(read_private(_pending_path(key)))
        pending = PendingRegistration(**data)
    except (OSError, ValueError, TypeError):
        return None
    return pending if pending.hub == hub else None


def pending_forget(key: str) -> None:
    _pending_path(key).unlink(missing_ok=True)


def pending_registrations(hub: str) -> Iterator[PendingRegistration]:
    """Every pending registration on `hub`."""
    for path in sessions_dir().glob("*.pending"):
        pending = pending_load(path.stem, hub) if SESSION_ID_CHARS.match(path.stem) else None
        if pending is not None:
            yield pending


class SessionLockBusy(TimeoutError):
    """The session's lock stayed held (another hook, or the MCP server, registering it) until the
    caller's time was up. Nothing of the hub's: the hub was not asked."""


LOCK_POLL = 0.02  # seconds between tries of a lock held elsewhere, when the wait is bounded


@contextlib.contextmanager
def session_lock(name: str, *, until: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock (a 0600 file in the sessions folder) while registering a session for
    `name`, so hooks that start together register one session, not one each. The kernel releases
    it when the process dies, so a killed hook never leaves it held.
    `until`: a monotonic time after which to stop waiting for it (SessionLockBusy); None waits."""
    safe = name if SESSION_ID_CHARS.match(name) else hashlib.sha256(name.encode()).hexdigest()[:32]
    fd = os.open(sessions_dir() / f".{safe}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if until is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    left = until - time.monotonic()
                    if left <= 0:
                        raise SessionLockBusy(
                            f"The lock of saved session {name} was held elsewhere (another hook or the "
                            "MCP server registering it) until this call's time was up."
                        ) from None
                    time.sleep(min(LOCK_POLL, left))
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


class Breaker:
    """A small per-hub circuit breaker for the hooks (`$SWITCHBOARD_HOME/sessions/.breaker-*.json`,
    0600): after a hub failure, hooks skip the hub until `until` instead of each paying the
    timeout; each further failure doubles the pause up to `longest` seconds."""

    def __init__(self, hub: str, *, first: float = 15.0, longest: float = 120.0) -> None:
        self.path = sessions_dir() / f".breaker-{hashlib.sha256(hub.encode()).hexdigest()[:16]}.json"
        self.first, self.longest = first, longest

    def _state(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {"until": float(data["until"]), "pause": float(data["pause"])}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def open_until(self) -> float | None:
        """When the hub may next be tried (wall clock), or None when it may be tried now."""
        until = self._state().get("until")
        return until if until is not None and until > time.time() else None

    def trip(self) -> float:
        """Record a failure; returns the pause in seconds."""
        last = self._state().get("pause")
        pause = min(self.longest, last * 2) if last else self.first
        write_private(self.path, json.dumps({"until": time.time() + pause, "pause": pause}))
        return pause

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)


def log_path() -> Path:
    return home_dir() / "agent.log"


def home_problems() -> list[UnsafeHome]:
    """What makes `$SWITCHBOARD_HOME` unsafe to use (`home.refuse_unsafe`), each with its fix: the
    home, then its sessions folder, then each file the agent side reads there. Empty when it is
    safe. The first problem hides the ones inside it (a folder refused is not looked into)."""
    try:
        home = home_dir()
        folder = sessions_dir()
    except UnsafeHome as exc:
        return [exc]
    found = []
    names = [
        home / HUB_URL_FILE,
        home / ENROLL_KEY_FILE,
        *sorted(folder.glob("*.json")),
        *sorted(folder.glob("*.pending")),
    ]
    for path in names:
        try:
            read_private(path)
        except UnsafeHome as exc:
            found.append(exc)
        except (OSError, ValueError):
            continue  # gone, or not text: nothing an attacker could have made believed
    return found
