"""REST endpoints for sessions, discovery, messages, the inbox and the audit (under /api/v1/)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema, Status

from messaging.auth import (
    AUTH,
    AsyncBearerAuth,
    EnrollmentKeyAuth,
    operator,
    principal,
    request_from_this_machine,
)
from messaging.errors import Invalid, SwitchboardError
from messaging.framing import frames_for_recipient
from messaging.models import AgentSession
from messaging.principals import Principal
from messaging.selectors import agents_list, audit_list, message_for_viewer, message_status, open_session_of
from messaging.services.delivery import inbox_ack, inbox_pull
from messaging.services.pipeline import BATCH_MAX, messages_send_batch
from messaging.services.request import SendRequest
from messaging.services.sessions import (
    session_deregister,
    session_end_turn,
    session_register,
    session_report_bypass,
    session_set_status,
    session_start_turn,
    session_summary,
    session_touch,
)
from messaging.services.together import message_send_together
from messaging.services.waiting import inbox_wait

router = Router(tags=["messaging"])


class RegisterIn(Schema):
    name: str = Field(..., description="A label; names need not be unique (the ref tells them apart).")
    cwd: str = ""
    kind: str = "script"
    permission_mode: Literal["default", "bypass"] = "default"
    peer_address: str = Field("", description="`uds:/path/to.sock` to have messages written to a socket.")
    status: Literal["busy", "idle", "stopped"] = "idle"
    headless: bool = False
    registration_key: str | None = Field(
        None,
        description="Random, 128 bits or more (22-128 URL-safe characters), chosen by the client and kept "
        "until it has the answer: a retry with the same key gets the session it registered (same name, "
        "still open) back with a new token, instead of a second session.",
    )


class SessionOut(Schema):
    id: str
    name: str
    ref: str
    cwd: str
    kind: str
    status: str
    permission_mode: str | None = Field(None, description="null in another session's listing")
    inbound_policy: str | None = Field(None, description="null in another session's listing")
    peer_address: str
    addressable: bool
    last_seen: str | None
    dead: bool = False
    liveness: str = ""
    tier: str = Field("host", description="host (this hub), or channel / lan / relay for another hub's agent")
    hub: str | None = None


class RegisteredOut(SessionOut):
    token: str = Field(..., description="Shown once. Send it as `Authorization: Bearer <token>`.")
    reissued: bool = Field(
        False, description="A retried registration (same registration_key): the earlier token is revoked."
    )


class AgentsOut(Schema):
    agents: list[SessionOut]


class SessionPatch(Schema):
    status: Literal["busy", "idle", "stopped", "exited"] | None = None
    final_answer: str | None = Field(None, description="With status idle: the turn's final answer.")
    unless_inbox: bool = Field(
        False,
        description="With status idle (a turn ending): when messages are waiting, do not go idle; "
        "return them in `messages` (marked delivered) instead.",
    )
    limit: int = Field(100, description="With unless_inbox: at most this many messages.")
    permission_mode: Literal["bypass"] | None = Field(
        None,
        description="`bypass`: the agent now runs tools without asking (one way: a session never "
        "goes back to `default` by its own word).",
    )


class SessionPatchOut(SessionOut):
    messages: list[dict[str, Any]] | None = Field(
        None,
        description="With unless_inbox: the waiting messages pulled instead of going idle ([] if it went idle).",
    )


class FileRef(Schema):
    sha256: str
    name: str = ""


class SendIn(Schema):
    to: str
    message: str
    summary: str = ""
    idempotency_key: str | None = None
    priority: Literal["normal", "urgent"] = "normal"
    in_reply_to: uuid.UUID | None = None
    files: list[FileRef] = Field(
        default_factory=list, description="Up to 10 uploaded files (POST /api/v1/files)."
    )


class Peer(Schema):
    id: str
    name: str
    ref: str


class SendOut(Schema):
    id: str
    status: str
    to: Peer
    result: str
    hint: str | None = Field(
        None, description="What to do next: `message_status` = follow it with GET /api/v1/messages/{id}."
    )
    tier: str
    trust: str
    duplicate: bool = False


class AckIn(Schema):
    ids: list[str] = Field(..., min_length=1, max_length=1000)


class ErrorOut(Schema):
    error: str
    detail: str
    hint: str | None = Field(
        None, description="What to do next, when there is a step: `list_agents` = GET /api/v1/agents."
    )


ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


@router.post("/sessions", response={201: RegisteredOut, **ERRORS}, auth=EnrollmentKeyAuth())
def register(request: HttpRequest, body: RegisterIn) -> Status:
    """Register an agent session (needs the enrollment key). Returns its token, once."""
    reg = session_register(**body.dict(), from_this_machine=request_from_this_machine(request))
    return Status(201, {**session_summary(reg.session), "token": reg.token, "reissued": reg.reissued})


@router.get("/sessions/me", response={200: SessionOut, **ERRORS}, auth=AUTH)
def me(request: HttpRequest) -> dict[str, Any]:
    """This session, as the hub sees it."""
    return session_summary(principal(request).require_session())


@router.patch("/sessions/me", response={200: SessionPatchOut, **ERRORS}, auth=AUTH)
def update_me(request: HttpRequest, body: SessionPatch) -> dict[str, Any]:
    """Report status (busy / idle with the final answer / stopped / exited), or that the agent now
    runs tools without asking (`permission_mode: bypass`). Any call is a heartbeat.
    `{"status": "idle", "unless_inbox": true}` ends a turn in one call: waiting messages come back
    (delivered) and the session stays busy, else it goes idle."""
    caller = principal(request)
    session = caller.require_session()
    if body.permission_mode is not None:
        session = session_report_bypass(session=session, actor=caller)
    if body.unless_inbox:
        if body.status != "idle":
            raise Invalid("bad_status", "unless_inbox goes with status idle (a turn ending).")
        turn = session_end_turn(
            session=session, actor=caller, final_answer=body.final_answer, limit=body.limit
        )
        return {**session_summary(turn.session), "messages": frames_for_recipient(turn.messages)}
    if body.status is not None:
        session = session_set_status(
            session=session, status=body.status, actor=caller, final_answer=body.final_answer
        )
    return session_summary(session)


@router.post("/sessions/me/heartbeat", response={200: SessionOut, **ERRORS}, auth=AUTH)
def heartbeat(request: HttpRequest) -> dict[str, Any]:
    """Say this session is alive (authentication already recorded the time)."""
    session = principal(request).require_session()
    session_touch(session)
    return session_summary(session)


@router.delete("/sessions/me", response={200: SessionOut, **ERRORS}, auth=AUTH)
def deregister(request: HttpRequest) -> dict[str, Any]:
    """Deregister: the session exits, its token stops working, what waited for it expires."""
    caller = principal(request)
    return session_summary(session_deregister(session=caller.require_session(), actor=caller))


@router.post("/sessions/{session_ref}/end", response={200: SessionOut, **ERRORS}, auth=AUTH)
def end_session(request: HttpRequest, session_ref: str) -> dict[str, Any]:
    """End a session by id or ref (operators, e.g. for a leaked token; a session may end itself
    as `me`): it exits, its token stops working and its sockets close, as when it deregisters."""
    caller = principal(request)
    return session_summary(session_deregister(session=open_session_of(caller, session_ref), actor=caller))


@router.delete("/sessions/{session_id}/data", response={200: dict, **ERRORS}, auth=AUTH)
def session_data(request: HttpRequest, session_id: uuid.UUID) -> dict[str, Any]:
    """Delete one session's data on request (operators): every message it sent or received, its pins
    and per-sender policies either way. Answers the counts; the deletion is audited."""
    from messaging.services.retention import session_data_delete

    return session_data_delete(session_id=session_id, actor=operator(request))


class PingOut(Schema):
    ok: bool
    caller: str


@router.get("/ping", response={200: PingOut, **ERRORS}, auth=AUTH)
def ping(request: HttpRequest) -> dict[str, Any]:
    """An authenticated no-op: checks the token and answers. For health checks and as the
    baseline the benchmarks compare the send path with."""
    return {"ok": True, "caller": principal(request).actor}


@router.get("/agents", response={200: AgentsOut, **ERRORS}, auth=AUTH)
def agents(request: HttpRequest, name: str | None = None, include_exited: bool = False) -> dict[str, Any]:
    """Discover sessions: name, ref, cwd, status, whether they can take a message now."""
    return {"agents": agents_list(viewer=principal(request), name=name, include_exited=include_exited)}


@router.post("/messages", response={201: SendOut, **ERRORS, 413: ErrorOut, 429: ErrorOut}, auth=AUTH)
def send(request: HttpRequest, body: SendIn) -> Status:
    """Send a plain-text message to one session (by name, `name [ref]`, ref, id or `lead`)."""
    caller = principal(request)
    outcome = message_send_together(
        SendRequest(
            sender=caller.require_session(),
            to=body.to,
            text=body.message,
            summary=body.summary,
            idempotency_key=body.idempotency_key,
            priority=body.priority,
            in_reply_to=str(body.in_reply_to) if body.in_reply_to else None,
            actor=caller,
            files=[f.dict() for f in body.files] or None,
        )
    )
    # A SendOut, not its dict: ninja dumps a model of the response's own type without validating it again.
    return Status(201, SendOut.model_validate(outcome.as_dict()))


class BatchItemIn(SendIn):
    pass


class BatchIn(Schema):
    messages: list[BatchItemIn] = Field(
        ..., min_length=1, max_length=BATCH_MAX, description="Messages, each as for POST /messages."
    )


class BatchItemOut(Schema):
    index: int
    id: str | None = None
    status: str | None = None
    to: Peer | None = None
    result: str | None = None
    hint: str | None = None
    tier: str | None = None
    trust: str | None = None
    duplicate: bool = False
    error: str | None = None
    detail: str | None = None


class BatchOut(Schema):
    accepted: int
    failed: int
    results: list[BatchItemOut]


@router.post("/messages/batch", response={201: BatchOut, **ERRORS, 413: ErrorOut, 429: ErrorOut}, auth=AUTH)
def send_batch(request: HttpRequest, body: BatchIn) -> HttpResponse:
    """Send many messages in one request, each checked exactly as a single send. Answered after all
    accepted ones are committed; `results[i]` is message i's outcome or its error."""
    caller = principal(request)
    outcomes = messages_send_batch(
        sender=caller.require_session(),
        items=[
            {
                "to": m.to,
                "text": m.message,
                "summary": m.summary,
                "idempotency_key": m.idempotency_key,
                "priority": m.priority,
                "in_reply_to": str(m.in_reply_to) if m.in_reply_to else None,
                "files": [f.dict() for f in m.files] or None,
            }
            for m in body.messages
        ],
        actor=caller,
    )
    # Written here rather than validated item by item against BatchOut (a thousand items cost more
    # to check than to send); the shape is BatchOut's: each item has exactly BatchItemOut's fields.
    blank = {name: info.get_default() for name, info in BatchItemOut.model_fields.items()}
    results = [
        {**blank, **{k: v for k, v in o.as_dict().items() if k in blank}, "index": i}
        for i, o in enumerate(outcomes)
    ]
    failed = sum(isinstance(o, SwitchboardError) for o in outcomes)
    answer = {"accepted": len(outcomes) - failed, "failed": failed, "results": results}
    return HttpResponse(orjson.dumps(answer), status=201, content_type="application/json")


@router.get("/messages/{message_id}", response={200: dict, **ERRORS}, auth=AUTH)
def message_detail(request: HttpRequest, message_id: str) -> dict[str, Any]:
    """A message's state and history. Only its sender and operators can see it."""
    return message_status(message_for_viewer(message_id=message_id, viewer=principal(request)))


def _pull(
    caller: Principal, limit: int, include_unacked: bool, status: str | None = None
) -> list[dict[str, Any]]:
    session = caller.require_session()
    if status is not None:
        if status != "busy":
            raise Invalid("bad_status", "An inbox pull can only report status busy (a turn starting).")
        pulled = session_start_turn(
            session=session, actor=caller, limit=limit, include_unacked=include_unacked
        )
    else:
        pulled = inbox_pull(recipient=session, actor=caller, limit=limit, include_unacked=include_unacked)
    return frames_for_recipient(pulled)


@router.get("/inbox", response={200: dict, **ERRORS}, auth=AsyncBearerAuth())
async def inbox(
    request: HttpRequest,
    wait: float = 0,
    limit: int = 100,
    include_unacked: bool = False,
    status: str | None = None,
):
    """Pull queued messages (marks them delivered). `wait` long-polls up to that many seconds;
    `include_unacked` also returns delivered messages not yet acked (after a crash mid-turn);
    `status=busy` reports the session busy in the same call (a prompt after an idle). A wait
    whose token is revoked meanwhile (the session exits, or a retried registration replaces the
    token) answers 401 and takes nothing."""
    caller = principal(request)
    session: AgentSession = caller.require_session()
    wait = max(0.0, min(float(wait), float(settings.SWITCHBOARD_INBOX_MAX_WAIT)))
    messages = await sync_to_async(_pull)(caller, limit, include_unacked, status)
    if not messages and wait > 0:
        messages = await inbox_wait(
            recipient_id=session.id,
            token_hash=session.token_hash,
            seconds=wait,
            take=lambda: sync_to_async(_pull)(caller, limit, include_unacked),
        )
    return {"messages": messages}


@router.post("/inbox/ack", response={200: dict, **ERRORS}, auth=AUTH)
def ack(request: HttpRequest, body: AckIn) -> dict[str, Any]:
    """Mark messages read (by message id). The sender then sees `read`."""
    caller = principal(request)
    return inbox_ack(recipient=caller.require_session(), actor=caller, message_ids=body.ids)


@router.get("/audit", response={200: dict, **ERRORS}, auth=AUTH)
def audit(request: HttpRequest, after: int = 0, limit: int = 100, kind: str | None = None) -> dict[str, Any]:
    """The audit feed (operators): who changed what, with lengths and hashes, never text."""
    operator(request)
    return {"events": audit_list(after_id=after, limit=limit, kind=kind)}
