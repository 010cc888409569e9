"""REST endpoints for holds (operators only) and inbound policy (under /api/v1/).

A session token gets 403 on every hold endpoint and on any other session's policy: a message
or a session token is never consent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.http import HttpRequest
from ninja import Field, Path, Router, Schema

from messaging.auth import AUTH, operator, principal
from messaging.errors import Conflict, NotFound
from messaging.models import Delivery
from messaging.selectors import open_session_of
from messaging.services.delivery import Moved
from messaging.services.holds import holds_decide, holds_list, message_reveal
from messaging.services.policies import (
    policy_set,
    policy_view,
    sender_policy_set,
)

router = Router(tags=["holds and policy"])

Action = Literal["accept", "hold", "refuse"]
DeliveryId = Annotated[int, Field(ge=1, le=2**63 - 1)]


class ErrorOut(Schema):
    error: str
    detail: str


ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class ReasonIn(Schema):
    reason: str = Field(
        "",
        max_length=500,
        description="Shown to the sender; kept in the audit. Required to approve an escalated hold.",
    )


class DecideIn(Schema):
    ids: list[DeliveryId] = Field(
        ..., min_length=1, max_length=1000, description="Delivery ids of the holds (`id` in GET /holds)."
    )
    approve: bool
    reason: str = Field("", max_length=500)


class PolicyIn(Schema):
    policy: Action | None = Field(
        ..., description="accept, hold or refuse; null clears it (the default by permission mode applies)."
    )
    hold_expiry_seconds: int | None = Field(None, description="Operators only: how long holds wait.")
    sensitive_exempt: bool | None = Field(
        None,
        description="Operators only: sensitive messages from this verified sender are not forced into a hold.",
    )


class SenderPolicyIn(Schema):
    action: Action | None = Field(..., description="accept, hold or refuse for this sender; null clears it.")


def _moved(moved: list[Moved]) -> list[dict[str, Any]]:
    return [
        {
            "id": m.delivery_id,
            "message_id": str(m.message_id),
            "from_state": m.from_state,
            "state": m.to_state,
        }
        for m in moved
    ]


@router.get("/holds", response={200: dict, **ERRORS}, auth=AUTH)
def holds(request: HttpRequest, recipient: str | None = None) -> dict[str, Any]:
    """Pending holds, urgent first then oldest (operators only)."""
    caller = operator(request)
    recipient_id = str(open_session_of(caller, recipient).id) if recipient else None
    return {"holds": holds_list(recipient_id=recipient_id)}


def _decide_one(request: HttpRequest, delivery_id: int, approve: bool, reason: str) -> dict[str, Any]:
    caller = operator(request)
    moved = holds_decide(delivery_ids=[delivery_id], approve=approve, actor=caller, reason=reason)
    if not moved:
        state = Delivery.objects.filter(pk=delivery_id).values_list("state", flat=True).first()
        if state is None:
            raise NotFound(f"No hold with id {delivery_id}.")
        raise Conflict(f"Delivery {delivery_id} is {state}, not held; nothing was changed.", state=state)
    return {"id": delivery_id, "state": moved[0].to_state, "message_id": str(moved[0].message_id)}


@router.post("/holds/{delivery_id}/approve", response={200: dict, **ERRORS}, auth=AUTH)
def approve(
    request: HttpRequest, delivery_id: Annotated[int, Path(ge=1, le=2**63 - 1)], body: ReasonIn | None = None
) -> dict[str, Any]:
    """Approve one hold: it is queued for its recipient and pushed now (operators only). An
    escalated hold (a sensitive message) is approved only with a reason (`reason_required`)."""
    return _decide_one(request, delivery_id, True, body.reason if body else "")


@router.post("/holds/{delivery_id}/reveal", response={200: dict, **ERRORS}, auth=AUTH)
def reveal(request: HttpRequest, delivery_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> dict[str, Any]:
    """The held message as sent, its secrets unmasked (operators only; the reveal is audited)."""
    caller = operator(request)
    message_id = Delivery.objects.filter(pk=delivery_id).values_list("message_id", flat=True).first()
    if message_id is None:
        raise NotFound(f"No hold with id {delivery_id}.")
    message = message_reveal(message_id=message_id, actor=caller)
    return {
        "id": delivery_id,
        "message_id": str(message.id),
        "summary": message.summary,
        "text": message.text,
    }


@router.post("/holds/{delivery_id}/deny", response={200: dict, **ERRORS}, auth=AUTH)
def deny(
    request: HttpRequest, delivery_id: Annotated[int, Path(ge=1, le=2**63 - 1)], body: ReasonIn | None = None
) -> dict[str, Any]:
    """Deny one hold, with an optional reason the sender is told (operators only)."""
    return _decide_one(request, delivery_id, False, body.reason if body else "")


@router.post("/holds/decide", response={200: dict, **ERRORS}, auth=AUTH)
def decide(request: HttpRequest, body: DecideIn) -> dict[str, Any]:
    """Approve or deny many holds at once. Ones already decided or expired are listed as skipped."""
    caller = operator(request)
    moved = holds_decide(delivery_ids=body.ids, approve=body.approve, actor=caller, reason=body.reason)
    done = {m.delivery_id for m in moved}
    return {"moved": _moved(moved), "skipped": sorted(set(body.ids) - done)}


@router.get("/sessions/{session_ref}/policy", response={200: dict, **ERRORS}, auth=AUTH)
def get_policy(request: HttpRequest, session_ref: str) -> dict[str, Any]:
    """A session's inbound policy and per-sender overrides (`me`, or any session for operators)."""
    caller = principal(request)
    session = open_session_of(caller, session_ref)
    if not caller.is_self_or_operator(session):
        caller.require_operator()
    return policy_view(session=session)


@router.put("/sessions/{session_ref}/policy", response={200: dict, **ERRORS}, auth=AUTH)
def put_policy(request: HttpRequest, session_ref: str, body: PolicyIn) -> dict[str, Any]:
    """Set inbound policy. Operators set any session's (the floor); a session sets its own, stricter only."""
    caller = principal(request)
    session = open_session_of(caller, session_ref)
    session = policy_set(
        session=session,
        policy=body.policy,
        actor=caller,
        hold_expiry_seconds=body.hold_expiry_seconds,
        sensitive_exempt=body.sensitive_exempt,
    )
    return policy_view(session=session)


@router.put("/sessions/{session_ref}/senders/{sender_ref}", response={200: dict, **ERRORS}, auth=AUTH)
def put_sender_policy(
    request: HttpRequest, session_ref: str, sender_ref: str, body: SenderPolicyIn
) -> dict[str, Any]:
    """Accept, hold or refuse one sender (null clears the rule). Same powers as the policy itself."""
    caller = principal(request)
    recipient = open_session_of(caller, session_ref)
    sender = open_session_of(caller, sender_ref)
    sender_policy_set(recipient=recipient, sender=sender, action=body.action, actor=caller)
    return policy_view(session=recipient)
