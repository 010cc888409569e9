"""Which hub session a long-running agent process (the MCP server) acts as.

In order: `SWITCHBOARD_TOKEN` (a session registered elsewhere); with `SWITCHBOARD_ATTACH=hooks`,
the session the Claude Code hooks registered for this folder; otherwise a session of its own,
registered on start and deregistered on exit. Only a session it registered itself is deregistered.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from console.agent.client import HubClient, HubError
from console.agent.config import hub_url, session_for_cwd, session_name

T = TypeVar("T")


class Identity:
    def __init__(
        self,
        *,
        url: str | None = None,
        cwd: str | None = None,
        token: str | None = None,
        attach_to_hooks: bool = False,
        kind: str = "mcp",
        make_client: Callable[[str, str | None], HubClient] | None = None,
    ) -> None:
        self.url = url or hub_url()
        self.cwd = cwd or os.getcwd()
        self.kind = kind
        self.attach_to_hooks = attach_to_hooks
        self._make_client = make_client or (lambda u, t: HubClient(u, t))
        self._client: HubClient | None = self._make_client(self.url, token) if token else None
        self.owned = False  # True when this process registered the session and must deregister it
        self.session: dict[str, Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, **kwargs: Any) -> Identity:
        return cls(
            token=os.environ.get("SWITCHBOARD_TOKEN", "").strip() or None,
            attach_to_hooks=os.environ.get("SWITCHBOARD_ATTACH", "").strip().lower() == "hooks",
            **kwargs,
        )

    def register(self) -> HubClient:
        client = self._make_client(self.url, None)
        self.session = client.register(
            name=session_name(self.cwd), cwd=self.cwd, kind=self.kind, status="busy"
        )
        self._client, self.owned = client, True
        return client

    def client(self) -> HubClient:
        """The client acting as this process's session, resolved on first use."""
        with self._lock:
            if self._client is not None:
                return self._client
            return self._resolve(stale_token=None)

    def _resolve(self, *, stale_token: str | None) -> HubClient:
        if self.attach_to_hooks:
            saved = session_for_cwd(self.cwd, self.url)
            if saved is not None and saved.token != stale_token:
                self._client = self._make_client(self.url, saved.token)
                self.session = {"id": saved.id, "name": saved.name, "ref": saved.ref}
                return self._client
        return self.register()

    def call(self, fn: Callable[[HubClient], T]) -> T:
        """Run `fn` with the session's client. When the hub no longer knows that session (a
        restarted hub, or Claude Code's /clear started a new one), resolve it again once and retry."""
        client = self.client()
        try:
            return fn(client)
        except HubError as exc:
            if exc.status != 401 or not (self.owned or self.attach_to_hooks):
                raise
            with self._lock:
                self._client = None
                client = self._resolve(stale_token=client.token)
            return fn(client)

    def start(self) -> None:
        """Register now unless attaching to a hooks session (those appear a moment later)."""
        if not self.attach_to_hooks:
            self.client()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self.owned:
                client.deregister()
        finally:
            client.close()
