"""One small typed client for the hub's REST API (/api/v1). The CLI, the MCP server and the hooks all
talk to the hub through it, so request building, authentication and error mapping live here once.

Every failure is a `HubError` with the hub's stable error code and sentence; a hub that cannot be
reached at all is `HubUnreachable` (code `unreachable`), which callers treat as "retry later".
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from switchboard_agent.config import enroll_key, hub_of_this_home, hub_url
from switchboard_agent.transport import (
    HTTPTransport,
    Request,
    Timeout,
    TimeoutException,
    Transport,
    TransportError,
    UntrustedListener,
)

DEFAULT_TIMEOUT = Timeout(read=10.0, connect=2.0)


class HubError(Exception):
    """The hub answered with an error (or could not be reached). `code` is the hub's error code."""

    def __init__(self, code: str, detail: str, *, status: int = 0, data: dict[str, Any] | None = None):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status
        self.data = data or {}

    @property
    def retryable(self) -> bool:
        """True when the same call may succeed later (hub down, busy, rate limited)."""
        return self.status in (0, 429, 502, 503, 504)


class HubUnreachable(HubError):
    def __init__(self, detail: str):
        super().__init__("unreachable", detail, status=0)


class NotConfigured(HubError):
    """This machine lacks what the call needs (the enrollment key): the hub was not asked."""

    def __init__(self, code: str, detail: str):
        super().__init__(code, detail, status=0)


class HubClient:
    """A session's (or an enrolling caller's) view of one hub."""

    # Tests point every client at an in-process hub (a WSGI transport) through this.
    default_transport: Transport | None = None

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: Timeout | float = DEFAULT_TIMEOUT,
        transport: Transport | None = None,
    ) -> None:
        self.url = (url or hub_url()).rstrip("/")
        self.token = token
        self.timeout = timeout if isinstance(timeout, Timeout) else Timeout(read=timeout, connect=timeout)
        # A monotonic time by which every request must have ended (the hooks set one per call):
        # each request's timeouts are cut to what is left, and none starts after it.
        self.deadline: float | None = None
        self.requests = 0  # round trips made (the hooks report how many each event cost)
        # A pull that failed on the hub's side or on the way back may still have handed messages
        # over (marked delivered); the next pull then asks for those too (see `inbox`).
        self.pull_unsettled = False
        given = transport or HubClient.default_transport
        self._own_transport = given is None
        self._transport: Transport = given if given is not None else HTTPTransport()

    def close(self) -> None:
        if self._own_transport:  # a transport passed in may serve other clients too
            self._transport.close()

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ------------------------------------------------------------------------------
    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One request; the decoded JSON body on 2xx, else `HubError`."""
        bearer = token or self.token
        headers = {"Accept": "application/json"}
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        limit = self.timeout if timeout is None else Timeout(read=timeout, connect=self.timeout.connect)
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0.05:
                raise HubUnreachable(f"No time was left to reach the hub at {self.url} (deadline passed).")
            limit = Timeout(read=min(limit.read, left), connect=min(limit.connect, left))
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        request = Request(
            method=method,
            url=f"{self.url}/api/v1/{path.lstrip('/')}" + (f"?{query}" if query else ""),
            headers=headers,
            body=None if body is None else json.dumps(body, ensure_ascii=False).encode(),
            timeout=limit,
        )
        self.requests += 1
        try:
            response = self._transport.handle(request)
        except TimeoutException as exc:
            raise HubUnreachable(
                f"The hub at {self.url} did not answer in time ({type(exc).__name__})."
            ) from exc
        except UntrustedListener as exc:
            raise HubUnreachable(f"Not using the hub at {self.url}: {exc}") from exc
        except TransportError as exc:
            raise HubUnreachable(f"The hub at {self.url} cannot be reached ({type(exc).__name__}).") from exc
        try:
            data = json.loads(response.content) if response.content else None
        except ValueError:
            data = None
        if 200 <= response.status < 300:
            return data
        found = data if isinstance(data, dict) else {}
        raise HubError(
            str(found.get("error") or f"http_{response.status}"),
            str(found.get("detail") or f"The hub answered HTTP {response.status}."),
            status=response.status,
            data=found,
        )

    # --- sessions ------------------------------------------------------------------------------
    def register(
        self,
        *,
        name: str,
        cwd: str = "",
        kind: str = "script",
        permission_mode: str = "default",
        peer_address: str = "",
        status: str = "idle",
        headless: bool = False,
        key: str | None = None,
        registration_key: str | None = None,
    ) -> dict[str, Any]:
        """Register a session with the enrollment key; the answer carries its token (shown once).
        The client then acts as that session. `registration_key` (random, kept by the caller until
        it has the answer) makes a retry get the same session back instead of a second one."""
        key = key or enroll_key(self.url)
        if not key:
            raise NotConfigured(
                "no_enroll_key",
                "No enrollment key: set SWITCHBOARD_ENROLL_KEY or put the hub's key in "
                "$SWITCHBOARD_HOME/enroll.key."
                if hub_of_this_home(self.url)
                else f"No enrollment key for the hub at {self.url}: set SWITCHBOARD_ENROLL_KEY to that "
                "hub's key ($SWITCHBOARD_HOME/enroll.key is kept for the hub of this home and is "
                "sent to no other).",
            )
        body = {
            "name": name,
            "cwd": cwd,
            "kind": kind,
            "permission_mode": permission_mode,
            "peer_address": peer_address,
            "status": status,
            "headless": headless,
        }
        if registration_key:
            body["registration_key"] = registration_key
        registered = self.call("POST", "sessions", body=body, token=key)
        self.token = registered["token"]
        return registered

    def me(self) -> dict[str, Any]:
        return self.call("GET", "sessions/me")

    def set_status(self, status: str, *, final_answer: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"status": status}
        if final_answer is not None:
            body["final_answer"] = final_answer
        return self.call("PATCH", "sessions/me", body=body)

    def report_bypass(self) -> dict[str, Any]:
        """Tell the hub the agent now runs tools without asking (one way; see the API)."""
        return self.call("PATCH", "sessions/me", body={"permission_mode": "bypass"})

    def end_turn(self, *, final_answer: str, limit: int = 100) -> list[dict[str, Any]]:
        """End a turn in one round trip: the messages waiting (now delivered; the session stays busy),
        or `[]` when none were and the session went idle with `final_answer`."""
        body = {"status": "idle", "final_answer": final_answer, "unless_inbox": True, "limit": limit}
        try:
            return self.call("PATCH", "sessions/me", body=body).get("messages") or []
        except HubError as exc:
            self._note_failed_pull(exc)
            raise

    def deregister(self) -> dict[str, Any]:
        return self.call("DELETE", "sessions/me")

    # --- messages ------------------------------------------------------------------------------
    def agents(self, *, name: str | None = None, include_exited: bool = False) -> list[dict[str, Any]]:
        params = {"name": name, "include_exited": "true" if include_exited else None}
        return self.call("GET", "agents", params=params)["agents"]

    def send(
        self,
        *,
        to: str,
        message: str,
        summary: str = "",
        idempotency_key: str | None = None,
        priority: str = "normal",
        in_reply_to: str | None = None,
    ) -> dict[str, Any]:
        body = {"to": to, "message": message, "summary": summary, "priority": priority}
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        if in_reply_to:
            body["in_reply_to"] = in_reply_to
        return self.call("POST", "messages", body=body)

    def inbox(
        self,
        *,
        wait: float = 0,
        limit: int = 100,
        include_unacked: bool = False,
        status: str | None = None,
    ) -> list[dict[str, Any]]:
        """Pull queued messages (the hub marks them delivered). `wait` long-polls up to that long;
        `status="busy"` reports the session busy in the same round trip.

        After a pull whose answer was lost (the hub failed, or the connection did, once the request
        was sent) the next pull includes delivered-but-unacked messages, so none is stranded."""
        params = {
            "wait": wait or None,
            "limit": limit,
            "include_unacked": "true" if include_unacked or self.pull_unsettled else None,
            "status": status,
        }
        try:
            messages = self.call("GET", "inbox", params=params, timeout=float(wait) + 10.0)["messages"]
        except HubError as exc:
            self._note_failed_pull(exc)
            raise
        self.pull_unsettled = False
        return messages

    def _note_failed_pull(self, exc: HubError) -> None:
        # A 4xx was refused before anything moved; a 5xx or a lost connection may not have been.
        if exc.status == 0 or exc.status >= 500:
            self.pull_unsettled = True

    def ack(self, ids: Iterable[str]) -> dict[str, Any]:
        return self.call("POST", "inbox/ack", body={"ids": list(ids)})

    def message_status(self, message_id: str) -> dict[str, Any]:
        return self.call("GET", f"messages/{message_id}")

    # --- teams and tasks (the teams REST API) --------------------------------------------------
    def my_team(self) -> dict[str, Any]:
        """`{"team": ..., "member": ...}` for the live team this session is on (nulls when none)."""
        return self.call("GET", "teams/mine")

    def team_create(self, *, name: str = "") -> dict[str, Any]:
        return self.call("POST", "teams", body={"name": name})

    def team_add_member(self, *, team_id: str, session: str, name: str | None = None) -> dict[str, Any]:
        return self.call("POST", f"teams/{team_id}/members", body={"session": session, "name": name or None})

    def tasks(self, *, team_id: str, status: str | None = None) -> list[dict[str, Any]]:
        return self.call("GET", f"teams/{team_id}/tasks", params={"status": status})["tasks"]

    def task(self, task_id: int) -> dict[str, Any]:
        return self.call("GET", f"tasks/{task_id}")

    def task_create(
        self, *, team_id: str, title: str, description: str = "", blocked_by: list[int] | None = None
    ) -> dict[str, Any]:
        body = {"title": title, "description": description, "blocked_by": blocked_by or []}
        return self.call("POST", f"teams/{team_id}/tasks", body=body)

    def task_claim(self, task_id: int, *, expected_revision: int | None = None) -> dict[str, Any]:
        return self.call("POST", f"tasks/{task_id}/claim", body={"expected_revision": expected_revision})

    def task_claim_next(self) -> dict[str, Any] | None:
        return self.call("POST", "tasks/claim-next")["task"]

    def task_complete(self, task_id: int, *, result: str = "") -> dict[str, Any]:
        return self.call("POST", f"tasks/{task_id}/complete", body={"result": result})

    def task_release(self, task_id: int) -> dict[str, Any]:
        return self.call("POST", f"tasks/{task_id}/release")

    def task_link(self, task_id: int, *, add: list[int], remove: list[int]) -> dict[str, Any]:
        body = {"add_blocked_by": add, "remove_blocked_by": remove}
        return self.call("PATCH", f"tasks/{task_id}", body=body)

    def shutdown_request(self, *, team_id: str, member_id: str, reason: str = "") -> dict[str, Any]:
        return self.call("POST", f"teams/{team_id}/members/{member_id}/shutdown", body={"reason": reason})

    def shutdown_respond(
        self, *, team_id: str, request_id: str, approve: bool, reason: str = ""
    ) -> dict[str, Any]:
        body = {"approve": approve, "reason": reason}
        return self.call("POST", f"teams/{team_id}/shutdown/{request_id}", body=body)

    def notify_when_idle(self, *, target: str) -> dict[str, Any]:
        return self.call("POST", "teams/subscriptions", body={"target": target})

    def team_join(self, *, lead: str, name: str | None = None) -> dict[str, Any]:
        """Ask to join `lead`'s team: the member (joined now) or `{"request": ...}` (asked)."""
        return self.call("POST", "teams/join", body={"lead": lead, "name": name or None})

    def join_requests(self) -> list[dict[str, Any]]:
        """This session's own open requests to join."""
        return self.call("GET", "teams/join")["requests"]

    def join_request_withdraw(self, request_id: str) -> dict[str, Any]:
        return self.call("DELETE", f"teams/join/{request_id}")

    def invitations(self, *, before: str | None = None) -> dict[str, Any]:
        """One page of open invitations, newest first: `{"invitations": [...], "next": ...}`, where
        `next` is the `before` of the following page (None on the last)."""
        return self.call("GET", "teams/invitations", params={"before": before})

    def invitation_answer(self, invitation_id: str, *, accept: bool) -> dict[str, Any]:
        return self.call("POST", f"teams/invitations/{invitation_id}/{'accept' if accept else 'decline'}")

    def watcher_allow(self, *, watcher: str) -> dict[str, Any]:
        return self.call("POST", "teams/watchers", body={"watcher": watcher})

    def watchers(self) -> list[dict[str, Any]]:
        return self.call("GET", "teams/watchers")["watchers"]

    def watcher_revoke(self, grant_id: int) -> dict[str, Any]:
        return self.call("DELETE", f"teams/watchers/{grant_id}")
