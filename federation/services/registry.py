"""The machine-wide registry behind the channel tier: a shared folder in which every hub on this
machine writes its own address and its live agents, one 0600 file each.

Layout under SWITCHBOARD_REGISTRY_DIR (0700; default ~/.switchboard-registry for a hub on the
default home; a hub with its own SWITCHBOARD_HOME joins only when the setting names a folder):
  hubs/<hub fingerprint>.json                    {name, url, public_key, updated_at}
  agents/<hub fingerprint>--<session id>.json    {hub, hub_key, hub_name, url, id, name, name_key, ref, cwd, updated_at}
Entries older than SWITCHBOARD_REGISTRY_STALE_SECONDS (4 h) are removed at start, and an entry is
removed when a delivery to its hub fails. A hub writes only while it has a public URL (it serves).

Trust (the channel tier rests on it): an entry vouches for a hub only when nobody but this user can
have written it. So the registry folder and its `hubs`/`agents` folders must be owned by this user
and not writable by group or others, and each entry must be a regular file (never a symbolic link)
owned by this user and not writable by group or others. Anything else is ignored, with one warning
per path; a hub neither writes to nor deletes from a folder it does not trust. A registry folder
this user owns that holds nothing but `hubs`/`agents` (one a hub made) is tightened to 0700 when
the hub writes; any other too-open folder is left for the operator to fix.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from federation.services.identity import hub_identity, key_fingerprint
from switchboard_agent.home import write_private

log = logging.getLogger(__name__)

# Bits that let someone other than the owner add, replace or change a file or a folder's entries.
_OPEN_TO_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_SUBFOLDERS = frozenset({"hubs", "agents"})
# Paths already warned about (bounded, so a folder full of planted files cannot grow it forever).
_warned: set[tuple[str, str]] = set()
_WARNED_MAX = 512


@dataclass(frozen=True)
class RegistryEntry:
    path: Path
    hub_key: str
    hub_name: str
    url: str
    session_id: str
    name: str
    name_key: str
    ref: str
    cwd: str
    updated_at: float


def registry_enabled() -> bool:
    """Whether this hub writes to the registry: it serves, is not a relay, and has a registry."""
    return (
        _registry_root() is not None
        and bool(settings.SWITCHBOARD_PUBLIC_URL)
        and settings.SWITCHBOARD_ROLE != "relay"
    )


def _registry_root() -> Path | None:
    root = settings.SWITCHBOARD_REGISTRY_DIR
    return Path(root) if root else None


def _warn_ignored(path: Path, why: str) -> None:
    """Say once per path and reason that the registry ignores `path` (names and modes, no contents)."""
    key = (str(path), why)
    if key in _warned or len(_warned) >= _WARNED_MAX:
        return
    _warned.add(key)
    log.warning(
        "registry: ignoring %s: it %s; only this user's own files in folders only this user can "
        "write vouch for a hub",
        path,
        why,
    )


def _owner_problem(st: os.stat_result) -> str | None:
    """Why a file or folder with this status could have been written by someone else, or None."""
    me = os.geteuid()
    if st.st_uid != me:
        return f"is owned by uid {st.st_uid}, not this user (uid {me})"
    if st.st_mode & _OPEN_TO_OTHERS:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _folder_problem(path: Path, *, root: bool) -> str | None:
    """Why entries under `path` cannot be trusted, or None. The registry folder itself may be a
    symbolic link this user made; `hubs` and `agents` may not. Raises FileNotFoundError when
    `path` (or the registry folder's link target) does not exist."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            if not root:
                return "is a symbolic link"
            if st.st_uid != os.geteuid():
                return f"is a symbolic link owned by uid {st.st_uid}"
            st = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    return _owner_problem(st)


def _trusted_dir(sub: str) -> Path | None:
    """`<registry>/<sub>` when its entries may be read, else None (no registry, not there yet, or
    a folder someone else could write: warned). Creates and changes nothing."""
    root = _registry_root()
    if root is None:
        return None
    for path in (root, root / sub):
        try:
            problem = _folder_problem(path, root=path == root)
        except FileNotFoundError:
            return None
        if problem:
            _warn_ignored(path, problem)
            return None
    return root / sub


def _writable_dir(sub: str) -> Path | None:
    """`<registry>/<sub>` for this hub's own entries, made 0700 if missing; None (warned) when a
    folder there is not this user's private folder and cannot be made one."""
    root = _registry_root()
    assert root is not None
    for path in (root, root / sub):
        try:
            problem = _folder_problem(path, root=path == root)
        except FileNotFoundError:
            # 0700 whatever the umask (it only removes bits); re-checked in case another user made
            # the folder first.
            try:
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
                problem = _folder_problem(path, root=path == root)
            except OSError as exc:  # e.g. a dangling link in its place, or a parent not writable
                problem = f"cannot be made ({exc.strerror or exc})"
        if problem and _tighten(path, root=path == root):
            problem = _folder_problem(path, root=path == root)
        if problem:
            _warn_ignored(path, problem)
            return None
    return root / sub


def _tighten(path: Path, *, root: bool) -> bool:
    """Make a registry folder this user owns 0700 when group or others can write it (earlier
    versions made the registry folder with the umask's mode). The registry folder itself only
    while it holds nothing but `hubs`/`agents`: a folder with other contents is the operator's.
    Entries another user left there stay ignored by their owner. Returns whether it changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not st.st_mode & _OPEN_TO_OTHERS:
            return False
        if root and not set(os.listdir(fd)) <= _SUBFOLDERS:
            return False
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    log.warning("registry: %s was writable by group or others; made it 0700", path)
    return True


def _write(path: Path, data: dict[str, Any]) -> None:
    # write_private: a new 0600 file beside `path`, renamed over it (atomic; never follows a link).
    write_private(path, json.dumps(data, sort_keys=True))


def registry_hub_announce() -> None:
    """Write (or refresh) this hub's own entry."""
    if not registry_enabled() or (folder := _writable_dir("hubs")) is None:
        return
    me = hub_identity()
    _write(
        folder / f"{me.fingerprint}.json",
        {
            "name": me.name,
            "url": settings.SWITCHBOARD_PUBLIC_URL,
            "public_key": me.public_key,
            "updated_at": time.time(),
        },
    )


def registry_agent_add(*, session_id: str, name: str, name_key: str, ref: str, cwd: str) -> None:
    """Record that `name` is live in this hub."""
    if not registry_enabled() or (folder := _writable_dir("agents")) is None:
        return
    me = hub_identity()
    _write(
        folder / f"{me.fingerprint}--{session_id}.json",
        {
            "hub": me.fingerprint,
            "hub_key": me.public_key,
            "hub_name": me.name,
            "url": settings.SWITCHBOARD_PUBLIC_URL,
            "id": session_id,
            "name": name,
            "name_key": name_key,
            "ref": ref,
            "cwd": cwd,
            "updated_at": time.time(),
        },
    )


def registry_agent_remove(*, session_id: str) -> None:
    """Remove this hub's entry for a session (it stopped being live here)."""
    if not registry_enabled() or (folder := _trusted_dir("agents")) is None:
        return
    (folder / f"{hub_identity().fingerprint}--{session_id}.json").unlink(missing_ok=True)


def _entry_problem(st: os.stat_result) -> str | None:
    """Why an entry with this (lstat) status could have been written by someone else, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    return _owner_problem(st)


def _load(path: Path) -> tuple[bool, dict[str, Any] | None]:
    """(trusted, data) for one entry: whether it is this user's own regular file that nobody else
    can write (checked on the file actually opened, never following a link; untrusted ones are
    warned about), and its JSON object (None when unreadable, gone or not an object)."""
    try:
        problem = _entry_problem(os.lstat(path))
        if problem is None:
            # O_NONBLOCK: a FIFO swapped in after the lstat opens without waiting, then fails fstat.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True, None  # gone, or unreadable: nothing to trust
    if problem:
        _warn_ignored(path, problem)
        return False, None
    with os.fdopen(fd, "rb") as handle:
        problem = _entry_problem(os.fstat(handle.fileno()))
        if problem:
            _warn_ignored(path, problem)
            return False, None
        try:
            data = json.loads(handle.read().decode("utf-8"))
        except (OSError, ValueError):
            return True, None
    return True, (data if isinstance(data, dict) else None)


def _read(path: Path) -> dict[str, Any] | None:
    """An entry's JSON object when it is trusted and readable, else None."""
    return _load(path)[1]


def _stale(updated_at: Any, now: float) -> bool:
    return (
        not isinstance(updated_at, int | float)
        or now - updated_at > settings.SWITCHBOARD_REGISTRY_STALE_SECONDS
    )


def registry_entries(*, include_own: bool = False) -> list[RegistryEntry]:
    """Every fresh agent entry (other hubs' only, unless `include_own`)."""
    folder = _trusted_dir("agents")
    if folder is None:
        return []
    mine = hub_identity().fingerprint
    now = time.time()
    found = []
    for path in sorted(folder.glob("*.json")):
        data = _read(path)
        if data is None or _stale(data.get("updated_at"), now):
            continue
        if data.get("hub") == mine and not include_own:
            continue
        try:
            found.append(
                RegistryEntry(
                    path=path,
                    hub_key=str(data["hub_key"]),
                    hub_name=str(data.get("hub_name", "")),
                    url=str(data["url"]),
                    session_id=str(data["id"]),
                    name=str(data["name"]),
                    name_key=str(data["name_key"]),
                    ref=str(data.get("ref", "")),
                    cwd=str(data.get("cwd", "")),
                    updated_at=float(data["updated_at"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return found


def _fresh_hub_entries() -> list[dict[str, Any]]:
    """The data of every hub entry that is fresh and names a public key. Only entries this user
    wrote, in folders only this user can write, count (see the module doc)."""
    folder = _trusted_dir("hubs")
    if folder is None:
        return []
    now = time.time()
    entries = []
    for path in folder.glob("*.json"):
        data = _read(path)
        if data and not _stale(data.get("updated_at"), now) and isinstance(data.get("public_key"), str):
            entries.append(data)
    return entries


def registry_hub_keys() -> dict[str, str]:
    """Fingerprint → public key of every hub with a fresh entry (the keys the channel tier trusts)."""
    return {key_fingerprint(data["public_key"]): data["public_key"] for data in _fresh_hub_entries()}


def registry_hub_urls() -> dict[str, str]:
    """Public key → URL of every hub with a fresh entry that names one (the addresses the channel
    tier trusts), from the same entries as `registry_hub_keys`."""
    return {
        data["public_key"]: data["url"].rstrip("/")
        for data in _fresh_hub_entries()
        if isinstance(data.get("url"), str)
    }


def registry_status() -> str:
    """One line for the operator: where the registry is, or why this hub ignores it (a folder
    someone else could write; entries not this user's own private files)."""
    root = _registry_root()
    if root is None:
        return "off (set SWITCHBOARD_REGISTRY_DIR)"
    ignored = 0
    for path in (root, *(root / sub for sub in sorted(_SUBFOLDERS))):
        try:
            problem = _folder_problem(path, root=path == root)
        except FileNotFoundError:
            continue
        if problem:
            return f"{path} IGNORED: it {problem} (make it this user's own, mode 0700)"
        if path != root:
            ignored += sum(1 for entry in path.glob("*.json") if not _load(entry)[0])
    if ignored:
        return f"{root} ({ignored} entries ignored: not this user's own files, or writable by others)"
    return str(root)


def registry_remove_stale(*, hub_key: str | None = None) -> int:
    """Delete stale entries (all of one hub's, when `hub_key` names a hub a delivery just failed to
    reach and whose entries are stale or unreadable). Returns how many files went. Only in folders
    this hub trusts, and only this user's own entries: another user's file is left (and ignored)."""
    folders = [f for f in (_trusted_dir("agents"), _trusted_dir("hubs")) if f is not None]
    now = time.time()
    removed = 0
    for path in [path for folder in folders for path in folder.glob("*.json")]:
        trusted, data = _load(path)
        if trusted and (data is None or _stale(data.get("updated_at"), now)):
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        log.info("registry: removed %d stale entries", removed)
    return removed


def registry_drop_hub(*, hub_key: str) -> int:
    """Forget every entry of a hub that no longer answers (a delivery to it failed to connect)."""
    agents, hubs = _trusted_dir("agents"), _trusted_dir("hubs")
    fp = key_fingerprint(hub_key)
    removed = 0
    paths = (list(agents.glob(f"{fp}--*.json")) if agents else []) + (
        list(hubs.glob(f"{fp}.json")) if hubs else []
    )
    for path in paths:
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def registry_refresh(*, live_sessions: list[dict[str, str]]) -> None:
    """Rewrite this hub's entry and its live agents' entries (keeps them fresh), dropping the rest."""
    if not registry_enabled():
        return
    registry_hub_announce()
    mine = hub_identity().fingerprint
    keep = set()
    for s in live_sessions:
        registry_agent_add(
            session_id=s["id"], name=s["name"], name_key=s["name_key"], ref=s["ref"], cwd=s["cwd"]
        )
        keep.add(f"{mine}--{s['id']}.json")
    folder = _writable_dir("agents")
    if folder is None:
        return
    for path in folder.glob(f"{mine}--*.json"):
        if path.name not in keep:
            path.unlink(missing_ok=True)


def registry_conflict(*, name_key: str, cwd: str) -> RegistryEntry | None:
    """Another hub on this machine where the same agent (name and working folder) is live now.
    A hub whose entry says so but that no longer answers is dropped from the registry instead."""
    if not registry_enabled():
        return None
    for entry in registry_entries():
        if entry.name_key != name_key or entry.cwd != cwd:
            continue
        if _hub_answers(entry.url):
            return entry
        registry_drop_hub(hub_key=entry.hub_key)
    return None


def _hub_answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url.rstrip("/") + "/api/v1/federation/hub", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def registry_session_changed(
    *, session_id: str, name: str, name_key: str, ref: str, cwd: str, live: bool
) -> None:
    """Keep this hub's registry entry for a session in step with its status (after commit)."""
    from django.db import transaction

    if not registry_enabled():
        return
    if live:
        transaction.on_commit(
            lambda: registry_agent_add(session_id=session_id, name=name, name_key=name_key, ref=ref, cwd=cwd)
        )
    else:
        transaction.on_commit(lambda: registry_agent_remove(session_id=session_id))
