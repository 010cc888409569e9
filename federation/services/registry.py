"""The machine-wide registry behind the channel tier: a shared folder in which every hub on this
machine writes its own address and its live agents, one 0600 file each.

Layout under SWITCHBOARD_REGISTRY_DIR (0700; default ~/.switchboard-registry for a hub on the
default home; a hub with its own SWITCHBOARD_HOME joins only when the setting names a folder):
  hubs/<hub fingerprint>.json                    {name, url, public_key, updated_at}
  agents/<hub fingerprint>--<session id>.json    {hub, hub_key, hub_name, url, id, name, name_key, ref, cwd, updated_at}
Entries older than SWITCHBOARD_REGISTRY_STALE_SECONDS (4 h) are removed at start, and an entry is
removed when a delivery to its hub fails. A hub writes only while it has a public URL (it serves).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from federation.services.identity import hub_identity, key_fingerprint
from switchboard_agent.home import write_private

log = logging.getLogger(__name__)


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


def _dir(sub: str) -> Path:
    root = _registry_root()
    assert root is not None
    path = root / sub
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _write(path: Path, data: dict[str, Any]) -> None:
    write_private(path, json.dumps(data, sort_keys=True))


def registry_hub_announce() -> None:
    """Write (or refresh) this hub's own entry."""
    if not registry_enabled():
        return
    me = hub_identity()
    _write(
        _dir("hubs") / f"{me.fingerprint}.json",
        {
            "name": me.name,
            "url": settings.SWITCHBOARD_PUBLIC_URL,
            "public_key": me.public_key,
            "updated_at": time.time(),
        },
    )


def registry_agent_add(*, session_id: str, name: str, name_key: str, ref: str, cwd: str) -> None:
    """Record that `name` is live in this hub."""
    if not registry_enabled():
        return
    me = hub_identity()
    _write(
        _dir("agents") / f"{me.fingerprint}--{session_id}.json",
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
    if not registry_enabled():
        return
    (_dir("agents") / f"{hub_identity().fingerprint}--{session_id}.json").unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _stale(updated_at: Any, now: float) -> bool:
    return (
        not isinstance(updated_at, int | float)
        or now - updated_at > settings.SWITCHBOARD_REGISTRY_STALE_SECONDS
    )


def registry_entries(*, include_own: bool = False) -> list[RegistryEntry]:
    """Every fresh agent entry (other hubs' only, unless `include_own`)."""
    root = _registry_root()
    if root is None or not root.is_dir():
        return []
    mine = hub_identity().fingerprint
    now = time.time()
    found = []
    for path in sorted(_dir("agents").glob("*.json")):
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


def registry_hub_keys() -> dict[str, str]:
    """Fingerprint → public key of every hub with a fresh entry (the keys the channel tier trusts)."""
    root = _registry_root()
    if root is None or not root.is_dir():
        return {}
    now = time.time()
    keys = {}
    for path in _dir("hubs").glob("*.json"):
        data = _read(path)
        if data and not _stale(data.get("updated_at"), now) and isinstance(data.get("public_key"), str):
            keys[key_fingerprint(data["public_key"])] = data["public_key"]
    return keys


def registry_remove_stale(*, hub_key: str | None = None) -> int:
    """Delete stale entries (all of one hub's, when `hub_key` names a hub a delivery just failed to
    reach and whose entries are stale or unreadable). Returns how many files went."""
    root = _registry_root()
    if root is None or not root.is_dir():
        return 0
    now = time.time()
    removed = 0
    for path in list(_dir("agents").glob("*.json")) + list(_dir("hubs").glob("*.json")):
        data = _read(path)
        if data is None or _stale(data.get("updated_at"), now):
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        log.info("registry: removed %d stale entries", removed)
    return removed


def registry_drop_hub(*, hub_key: str) -> int:
    """Forget every entry of a hub that no longer answers (a delivery to it failed to connect)."""
    root = _registry_root()
    if root is None or not root.is_dir():
        return 0
    fp = key_fingerprint(hub_key)
    removed = 0
    for path in list(_dir("agents").glob(f"{fp}--*.json")) + list(_dir("hubs").glob(f"{fp}.json")):
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
    for path in _dir("agents").glob(f"{mine}--*.json"):
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
