"""Registering a saved session so that each agent session holds one hub session, whatever happens
to the answer, and ending the saved sessions whose agent is gone.

A registration's answer can be lost after the hub committed it (a read timeout, the hook's
watchdog, a killed process). So the caller, holding the session's lock, first saves a pending
record with a random registration key (`config.PendingRegistration`, 0600) and sends the key with
the request; the hub hands the session that registered with it back, with a new token, to a retry
(`POST /api/v1/sessions`, `registration_key`). Whichever hook or MCP server registers that saved
session next resends the pending request; a success replaces the pending record with the saved
session. The key and the token are never logged.

An agent killed without its end hook leaves its saved session (token included) tied to a process
that is gone, and a SessionEnd while the hub was down leaves one marked ended: both still hold
their name on the hub. Before a registration, `sessions_reap` ends a few of those (`DELETE
sessions/me` with their own token) and removes their files, within a short budget; a hub that does
not answer leaves them for the next registration.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from switchboard_agent.client import HubClient, HubError
from switchboard_agent.config import (
    PendingRegistration,
    SavedSession,
    pending_forget,
    pending_load,
    pending_registrations,
    pending_save,
    saved_sessions,
    session_forget,
    session_save,
)

MakeClient = Callable[[str | None], HubClient]
REGISTRATION_KEY_BYTES = 32  # 256 bits; the hub asks for 128 or more
# Ending sessions left behind is never worth more than this of a registration's time: at most
# REAP_AT_ONCE per registration, each request cut to REAP_SECONDS.
REAP_AT_ONCE = 3
REAP_SECONDS = 0.5
REAP_BUDGET = 1.0
REGISTER_RESERVE = 1.0  # of a caller's deadline, kept for the registration that follows


def session_register_saved(
    make_client: MakeClient,
    *,
    key: str,
    hub: str,
    name: str,
    cwd: str,
    kind: str,
    anchor: str,
    alive: Callable[[str], bool],
    deadline: float | None = None,
    permission_mode: str = "default",
    status: str = "busy",
    peer_address: str = "",
    **saved_fields: Any,
) -> SavedSession:
    """Register the saved session `key` on `hub` and save it. The caller holds `session_lock(key)`.

    First a few saved sessions of agents that are gone are ended (`sessions_reap`, with `alive`
    and `deadline`; those named `name` first). A registration of this key sent before whose
    answer was never saved is resent as it was (its registration key, name, folder and kind), so
    the hub hands back the session it made then rather than a second one. `saved_fields` go into
    the saved session (`keys`, `client`, ...)."""
    sessions_reap(
        make_client, hub=hub, alive=alive, own_anchor=anchor, keep=key, prefer_name=name, deadline=deadline
    )
    pending = pending_load(key, hub)
    if pending is None:
        pending = PendingRegistration(
            key=key,
            hub=hub,
            registration_key=secrets.token_urlsafe(REGISTRATION_KEY_BYTES),
            name=name,
            cwd=cwd,
            kind=kind,
            permission_mode=permission_mode,
            anchor=anchor,
            peer_address=peer_address,
        )
        pending_save(pending)  # before the request: its answer may be lost once the hub commits
    with make_client(None) as client:
        try:
            body = _send(client, pending, status=status)
        except HubError as exc:
            if exc.status == 409 and exc.data.get("reason") == "registration_key":
                pending_forget(key)  # the key is another registration's: the next try draws a new one
            raise
    saved = SavedSession.registered(
        body, key=key, hub=hub, cwd=pending.cwd, anchor=anchor, status=status, **saved_fields
    )
    session_save(saved)
    pending_forget(key)  # after the save: a pending record left beside it only asks the same again
    return saved


def sessions_reap(
    make_client: MakeClient,
    *,
    hub: str,
    alive: Callable[[str], bool],
    own_anchor: str,
    keep: str,
    prefer_name: str = "",
    deadline: float | None = None,
) -> int:
    """End on `hub` the saved sessions nobody will end: those marked ended (their end never
    reached the hub) and those whose agent client process is gone (`alive(anchor)` is False; a
    session with no anchor, or this process's own, is never taken for gone); then forget them.
    Sessions named `prefer_name` first, at most REAP_AT_ONCE, within REAP_BUDGET seconds (and
    before `deadline`, a monotonic time). A registration pending for a process that is gone is
    finished and ended the same way (two requests). Returns how many were ended.

    A hub that cannot be reached stops it at once, raising `HubUnreachable` as the registration
    would have (one wait, not two): the files stay for the next registration."""
    until = time.monotonic() + REAP_BUDGET
    if deadline is not None:
        until = min(until, deadline - REGISTER_RESERVE)
    gone: list[SavedSession | PendingRegistration] = [
        saved
        for saved in saved_sessions(hub)
        if saved.key != keep and (saved.ended or _gone(saved.anchor, own_anchor, alive))
    ]
    gone += [p for p in pending_registrations(hub) if p.key != keep and _gone(p.anchor, own_anchor, alive)]
    gone.sort(key=lambda s: (s.name != prefer_name, isinstance(s, PendingRegistration)))
    ended = 0
    for left in gone[:REAP_AT_ONCE]:
        if time.monotonic() >= until:
            break
        try:
            _end(make_client, left)
        except HubError as exc:
            if exc.status == 0:
                raise  # the hub is away: the registration would fail too; the files wait
            if exc.status not in (401, 409):
                continue  # refused for now (busy, rate limited): try again next time
            # 401: the hub no longer knows the token (the session exited, or the hub was reset);
            # 409: a pending registration's key is another session's. Nothing is left to end.
        if isinstance(left, PendingRegistration):
            pending_forget(left.key)
        else:
            session_forget(left.key)
        ended += 1
    return ended


def _gone(anchor: str, own_anchor: str, alive: Callable[[str], bool]) -> bool:
    return bool(anchor) and anchor != own_anchor and not alive(anchor)


def _end(make_client: MakeClient, left: SavedSession | PendingRegistration) -> None:
    """End one left-behind session with its own token; a pending registration is first finished
    (the hub hands back the session it made, or makes one that ends at once)."""
    token = left.token if isinstance(left, SavedSession) else None
    with make_client(token) as client:
        if isinstance(left, PendingRegistration):
            _send(client, left)
        client.call("DELETE", "sessions/me", timeout=REAP_SECONDS)


def _send(client: HubClient, pending: PendingRegistration, *, status: str = "idle") -> dict[str, Any]:
    """The pending registration's request, exactly as it was first made (same registration key)."""
    return client.register(
        name=pending.name,
        cwd=pending.cwd,
        kind=pending.kind,
        permission_mode=pending.permission_mode,
        peer_address=pending.peer_address,
        status=status,
        registration_key=pending.registration_key,
    )
