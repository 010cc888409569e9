"""Registering a saved session so that each agent session holds one hub session, whatever happens
to the answer.

A registration's answer can be lost after the hub committed it (a read timeout, the hook's
watchdog, a killed process). So the caller, holding the session's lock, first saves a pending
record with a random registration key (`config.PendingRegistration`, 0600) and sends the key with
the request; the hub hands the session that registered with it back, with a new token, to a retry
(`POST /api/v1/sessions`, `registration_key`). Whichever hook or MCP server registers that saved
session next resends the pending request; a success replaces the pending record with the saved
session. The key and the token are never logged.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from switchboard_agent.client import HubClient, HubError
from switchboard_agent.config import (
    PendingRegistration,
    SavedSession,
    pending_forget,
    pending_load,
    pending_save,
    session_save,
)

MakeClient = Callable[[str | None], HubClient]
REGISTRATION_KEY_BYTES = 32  # 256 bits; the hub asks for 128 or more


def session_register_saved(
    make_client: MakeClient,
    *,
    key: str,
    hub: str,
    name: str,
    cwd: str,
    kind: str,
    anchor: str,
    permission_mode: str = "default",
    status: str = "busy",
    **saved_fields: Any,
) -> SavedSession:
    """Register the saved session `key` on `hub` and save it. The caller holds `session_lock(key)`.

    A registration of this key sent before whose answer was never saved is resent as it was (its
    registration key, name, folder and kind), so the hub hands back the session it made then
    rather than a second one. `saved_fields` go into the saved session (`keys`, `client`, ...)."""
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
        )
        pending_save(pending)  # before the request: its answer may be lost once the hub commits
    with make_client(None) as client:
        try:
            body = client.register(
                name=pending.name,
                cwd=pending.cwd,
                kind=pending.kind,
                permission_mode=pending.permission_mode,
                status=status,
                registration_key=pending.registration_key,
            )
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
