"""Structured team frames: typed, role-checked, persisted as messages of kind `frame`.

Frames never come from plain text (the send service refuses text that parses as one). Each type
has a fixed direction; a response must name an open request of the right kind and come from the
member that request was addressed to, once that request's frame has reached it. Anything else is
dropped: audited as `frame.dropped` and answered with an error that says why, never delivered as
prose.

A request row keeps the text its frames carried (`payload`, `reason`). That text is read on the
row only by whoever may read the frame that carried it (`request_summaries`): its author, and its
addressee once the frame could be pulled; a frame held for an operator keeps its text off the
row too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from messaging.errors import Conflict, Forbidden, Invalid, NotFound, SwitchboardError
from messaging.frame_types import HUB_FRAME_TYPES, MEMBER_FRAME_TYPES, FrameType
from messaging.models import AgentSession, Delivery, Message, PermissionMode, Tier
from messaging.principals import HUB, Principal
from messaging.sensitivity import mask_text
from messaging.services.audit import audit_event
from messaging.services.events import announce
from messaging.services.sending import SendOutcome
from teams.models import FrameRequest, Membership, RequestKind, RequestState, Role, Team
from teams.services.notify import frame_deliver, hub_notify
from teams.services.teams import member_of_caller, member_require_live, requests_close


@dataclass(frozen=True)
class FrameRule:
    sender_role: str  # lead | teammate
    opens: str = ""  # the request kind this frame opens
    answers: str = ""  # the request kind this frame answers


# Who sends each frame a member may send (messaging.frame_types.MEMBER_FRAME_TYPES), and the
# request it opens or answers. The hub's own frames (HUB_FRAME_TYPES) are never sent by a member.
FRAME_RULES: dict[str, FrameRule] = {
    FrameType.SHUTDOWN_REQUEST: FrameRule(Role.LEAD, opens=RequestKind.SHUTDOWN),
    FrameType.SHUTDOWN_RESPONSE: FrameRule(Role.TEAMMATE, answers=RequestKind.SHUTDOWN),
    FrameType.PLAN_APPROVAL_REQUEST: FrameRule(Role.TEAMMATE, opens=RequestKind.PLAN_APPROVAL),
    FrameType.PLAN_APPROVAL_RESPONSE: FrameRule(Role.LEAD, answers=RequestKind.PLAN_APPROVAL),
    FrameType.PERMISSION_REQUEST: FrameRule(Role.TEAMMATE, opens=RequestKind.PERMISSION),
    FrameType.PERMISSION_RESPONSE: FrameRule(Role.LEAD, answers=RequestKind.PERMISSION),
    FrameType.MODE_CHANGE: FrameRule(Role.LEAD),
}
HUB_ONLY_FRAMES = HUB_FRAME_TYPES
FRAME_TYPES = MEMBER_FRAME_TYPES | HUB_FRAME_TYPES
BODY_MAX_CHARS = 50_000
EXPIRED_REASON = "no answer before the deadline"


@dataclass
class FrameResult:
    """What a frame send did: the stored message (if any) and the request it opened or answered."""

    outcome: SendOutcome | None
    request: FrameRequest | None
    frame_type: str


def frame_drop(*, actor: Principal, team: Team | None, frame_type: str, why: str, detail: str) -> None:
    """Audit a refused frame (in its own transaction, so the refusal itself is never lost)."""
    with transaction.atomic():
        audit_event(
            "frame.dropped",
            actor=actor.actor,
            target=str(team.id) if team else "",
            detail={"type": str(frame_type)[:40], "why": why, "detail": detail[:300]},
        )


def _refuse(
    exc: SwitchboardError, *, actor: Principal, team: Team | None, frame_type: str, why: str
) -> SwitchboardError:
    frame_drop(actor=actor, team=team, frame_type=frame_type, why=why, detail=exc.detail)
    return exc


def frame_send(
    *,
    team: Team,
    actor: Principal,
    frame_type: str,
    to_member: Any = None,
    request_id: Any = None,
    approve: bool | None = None,
    reason: str = "",
    body: dict[str, Any] | None = None,
) -> FrameResult:
    """Send one structured frame from the caller's membership of `team`. See the module docstring."""
    body = dict(body or {})
    if frame_type not in FRAME_TYPES:
        raise _refuse(
            Invalid("unknown_frame", f"{frame_type!r} is not a team frame type."),
            actor=actor,
            team=team,
            frame_type=frame_type,
            why="unknown",
        )
    if frame_type in HUB_ONLY_FRAMES:
        raise _refuse(
            Forbidden(
                f"`{frame_type}` frames are written by the hub (on task assignment and turn end), not sent.",
                reason="hub_only_frame",
            ),
            actor=actor,
            team=team,
            frame_type=frame_type,
            why="hub_only",
        )
    rule = FRAME_RULES[frame_type]
    try:
        sender = member_of_caller(team=team, actor=actor)
        assert sender is not None
    except SwitchboardError as exc:
        raise _refuse(exc, actor=actor, team=team, frame_type=frame_type, why="not_a_member") from None
    if sender.role != rule.sender_role:
        who = "the lead" if rule.sender_role == Role.LEAD else "a teammate"
        raise _refuse(
            Forbidden(f"Only {who} sends `{frame_type}` frames.", reason="wrong_role"),
            actor=actor,
            team=team,
            frame_type=frame_type,
            why="peer_authored",
        )
    if len(str(body)) > BODY_MAX_CHARS or len(reason) > 1000:
        raise Invalid("frame_too_large", f"A frame body takes at most {BODY_MAX_CHARS:,} characters.")

    if rule.answers:
        return _answer(
            team=team,
            actor=actor,
            sender=sender,
            frame_type=frame_type,
            kind=rule.answers,
            request_id=request_id,
            approve=approve,
            reason=reason,
            body=body,
        )
    try:
        recipient = _recipient(team, sender, to_member)
    except SwitchboardError as exc:
        why = str(exc.extra.get("reason") or getattr(exc, "reason", "") or exc.code)
        raise _refuse(exc, actor=actor, team=team, frame_type=frame_type, why=why) from None
    if frame_type == "mode_change":
        mode = body.get("mode")
        if mode not in PermissionMode.values:
            raise Invalid(
                "bad_mode", f"mode_change takes body.mode, one of {', '.join(PermissionMode.values)}."
            )
    if rule.opens:
        return _open(
            team=team,
            actor=actor,
            sender=sender,
            recipient=recipient,
            frame_type=frame_type,
            kind=rule.opens,
            reason=reason,
            body=body,
        )
    with transaction.atomic():
        outcome = frame_deliver(
            sender=sender.session,
            recipient=recipient.session,
            frame_type=frame_type,
            fields=_envelope(team, sender, recipient, body=body, reason=reason),
            summary=f"{frame_type} from {sender.name}",
            actor=actor,
        )
        audit_event(
            "frame.sent",
            actor=actor.actor,
            target=str(team.id),
            message=outcome.message,
            detail={"type": frame_type, "to_member": str(recipient.id)},
        )
    return FrameResult(outcome=outcome, request=None, frame_type=frame_type)


def _recipient(team: Team, sender: Membership, to_member: Any) -> Membership:
    if to_member in (None, ""):
        if sender.role == Role.TEAMMATE:
            lead = Membership.objects.select_related("session").get(
                team=team, role=Role.LEAD, left_at__isnull=True
            )
            return lead
        raise Invalid("missing_to_member", "Name the teammate (`to_member`, a member id from the roster).")
    recipient = member_require_live(team=team, member_id=to_member)
    if recipient.id == sender.id:
        raise Invalid("self_target", "A member cannot send a frame to itself.")
    if sender.role == Role.TEAMMATE and recipient.role != Role.LEAD:
        raise Forbidden("A teammate's request frames go to its lead.", reason="wrong_role")
    return recipient


def _envelope(
    team: Team, sender: Membership, recipient: Membership, *, body: dict[str, Any], reason: str, **more: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "team_id": str(team.id),
        "from_member": str(sender.id),
        "from_name": sender.name,
        "to_member": str(recipient.id),
        **more,
    }
    if body:
        fields["body"] = body
    if reason:
        fields["reason"] = reason
    return fields


def request_timeout(kind: str) -> timedelta:
    if kind == RequestKind.SHUTDOWN:
        return timedelta(seconds=settings.SWITCHBOARD_SHUTDOWN_TIMEOUT_SECONDS)
    return timedelta(seconds=settings.SWITCHBOARD_FRAME_REQUEST_SECONDS)


def _open(
    *,
    team: Team,
    actor: Principal,
    sender: Membership,
    recipient: Membership,
    frame_type: str,
    kind: str,
    reason: str,
    body: dict[str, Any],
) -> FrameResult:
    now = timezone.now()
    if kind == RequestKind.SHUTDOWN:
        already = _open_shutdown(recipient, now)
        if already is not None:
            # Asking again while a request is open returns that request: no second frame, no loop.
            return FrameResult(outcome=None, request=already, frame_type=frame_type)
        # An open request past its deadline is settled first, so the new one can open.
        requests_expire_due(now=now)
    try:
        return _open_now(
            team=team,
            actor=actor,
            sender=sender,
            recipient=recipient,
            frame_type=frame_type,
            kind=kind,
            reason=reason,
            body=body,
            now=now,
        )
    except IntegrityError:
        # Two shutdown requests raced; the unique index let one open. Return that one.
        already = _open_shutdown(recipient, now)
        if already is None:
            raise
        return FrameResult(outcome=None, request=already, frame_type=frame_type)


def _open_shutdown(recipient: Membership, now: Any) -> FrameRequest | None:
    return FrameRequest.objects.filter(
        responder=recipient, kind=RequestKind.SHUTDOWN, state=RequestState.OPEN, expires_at__gt=now
    ).first()


def _open_now(
    *,
    team: Team,
    actor: Principal,
    sender: Membership,
    recipient: Membership,
    frame_type: str,
    kind: str,
    reason: str,
    body: dict[str, Any],
    now: Any,
) -> FrameResult:
    with transaction.atomic():
        request = FrameRequest.objects.create(
            team=team,
            kind=kind,
            requester=sender,
            responder=recipient,
            payload=body,
            reason=reason,
            expires_at=now + request_timeout(kind),
        )
        outcome = frame_deliver(
            sender=sender.session,
            recipient=recipient.session,
            frame_type=frame_type,
            fields=_envelope(
                team,
                sender,
                recipient,
                body=body,
                reason=reason,
                request_id=str(request.id),
                expires_at=request.expires_at.isoformat(),
            ),
            summary=f"{frame_type} from {sender.name}",
            actor=actor,
            # A shutdown request is read before older unread messages.
            priority="urgent" if kind == RequestKind.SHUTDOWN else "normal",
        )
        request.request_message = outcome.message
        request.save(update_fields=["request_message"])
        audit_event(
            "frame.request_opened",
            actor=actor.actor,
            target=str(team.id),
            message=outcome.message,
            detail={"type": frame_type, "request": str(request.id), "to_member": str(recipient.id)},
        )
        _announce_request(request)
    return FrameResult(outcome=outcome, request=request, frame_type=frame_type)


def _answer(
    *,
    team: Team,
    actor: Principal,
    sender: Membership,
    frame_type: str,
    kind: str,
    request_id: Any,
    approve: bool | None,
    reason: str,
    body: dict[str, Any],
) -> FrameResult:
    def stale(message: str) -> SwitchboardError:
        return _refuse(
            Conflict(message, reason="stale_frame"),
            actor=actor,
            team=team,
            frame_type=frame_type,
            why="stale",
        )

    if approve is None:
        raise Invalid("missing_approve", f"`{frame_type}` needs `approve`: true or false.")
    if not approve and not reason.strip():
        raise Invalid("missing_reason", "A rejection carries a reason the requester can act on.")
    try:
        request = FrameRequest.objects.select_related("requester__session", "responder").get(
            pk=request_id, team=team
        )
    except (FrameRequest.DoesNotExist, ValueError, Exception):
        raise stale(f"No open {kind} request {request_id} on this team; nothing was sent.") from None
    if request.kind != kind:
        raise stale(f"Request {request.id} is a {request.kind} request, not {kind}.")
    if request.responder_id != sender.id:
        raise _refuse(
            Forbidden(f"Request {request.id} was not addressed to you.", reason="wrong_responder"),
            actor=actor,
            team=team,
            frame_type=frame_type,
            why="peer_authored",
        )
    now = timezone.now()
    if request.state != RequestState.OPEN or request.expires_at <= now:
        raise stale(f"Request {request.id} is no longer open ({_state_now(request, now)}); nothing was sent.")
    # Only a request the responder could read is answered: one whose frame still waits for an
    # operator (held), or was refused or denied, never reached it. Pullable is for good once true
    # (a delivery never leaves the inbox for a hold), so this check cannot go stale before the write.
    if (request.request_message_id, sender.session_id) not in _pullable([request]):
        raise stale(
            f"Request {request.id} has not reached you (its frame is not in your inbox: held for an "
            "operator, or refused); nothing was sent."
        )
    requester = request.requester
    new_state = RequestState.APPROVED if approve else RequestState.REJECTED
    with transaction.atomic():
        moved = FrameRequest.objects.filter(pk=request.pk, state=RequestState.OPEN).update(
            state=new_state, answered_at=now, reason=reason[:1000]
        )
        if not moved:
            raise stale(f"Request {request.id} was answered a moment ago; nothing was sent.")
        outcome = None
        if requester.left_at is None:
            outcome = frame_deliver(
                sender=sender.session,
                recipient=requester.session,
                frame_type=frame_type,
                fields=_envelope(
                    team,
                    sender,
                    requester,
                    body=body,
                    reason=reason,
                    request_id=str(request.id),
                    approve=bool(approve),
                ),
                summary=f"{frame_type} from {sender.name}: {'approved' if approve else 'rejected'}",
                actor=actor,
            )
            # The answer's `reason` is the requester's to read once this frame could be pulled.
            FrameRequest.objects.filter(pk=request.pk).update(response_message=outcome.message)
        request.refresh_from_db()
        audit_event(
            "frame.request_answered",
            actor=actor.actor,
            target=str(team.id),
            message=outcome.message if outcome else None,
            detail={"type": frame_type, "request": str(request.id), "approve": bool(approve)},
        )
        _announce_request(request)
        if kind == RequestKind.SHUTDOWN and approve:
            _stop_for_shutdown(sender.session, actor)
    return FrameResult(outcome=outcome, request=request, frame_type=frame_type)


def _stop_for_shutdown(session: AgentSession, actor: Principal) -> None:
    from messaging.services.sessions import session_set_status

    session_set_status(session=session, status="stopped", actor=actor)


def _state_now(request: FrameRequest, now: Any) -> str:
    if request.state == RequestState.OPEN and request.expires_at <= now:
        return "timed out"
    return str(request.state)


def requests_expire_due(*, now: Any = None) -> list[FrameRequest]:
    """Close open requests past their deadline, once each, and tell the requester plainly."""
    now = now or timezone.now()
    due = list(
        FrameRequest.objects.filter(state=RequestState.OPEN, expires_at__lte=now)
        .select_related("requester__session", "responder__session", "team")
        .order_by("expires_at")[:500]
    )
    closed = []
    for request in due:
        with transaction.atomic():
            if not requests_close(
                FrameRequest.objects.filter(pk=request.pk),
                state=RequestState.EXPIRED,
                reason=EXPIRED_REASON,
                now=now,
            ):
                continue
            # Settled as written: the hub's sentence replaced the requester's text in `reason`.
            request.state, request.reason, request.answered_at = RequestState.EXPIRED, EXPIRED_REASON, now
            audit_event(
                "frame.request_expired",
                actor="hub",
                target=str(request.team_id),
                detail={"kind": request.kind, "request": str(request.id)},
            )
            _announce_request(request)
            if request.requester.left_at is None:
                hub_notify(
                    recipient=request.requester.session,
                    text=_expiry_sentence(request),
                    summary=f"{request.kind} request to {request.responder.name} timed out",
                )
            closed.append(request)
    return closed


def _expiry_sentence(request: FrameRequest) -> str:
    who = request.responder.name
    if request.kind == RequestKind.SHUTDOWN:
        return (
            f"Your shutdown request to {who} (request {request.id}) got no answer before its deadline. "
            f"{who} was NOT stopped and is still {request.responder.session.status}. The hub will not ask "
            "again by itself: send a new shutdown request, or ask the operator to stop it from the console."
        )
    return (
        f"Your {request.kind} request (request {request.id}) to {who} got no answer before its deadline "
        "and is closed; send a new request if you still need an answer."
    )


def request_get(*, team: Team, request_id: Any) -> FrameRequest:
    try:
        return FrameRequest.objects.get(pk=request_id, team=team)
    except (FrameRequest.DoesNotExist, ValueError, Exception) as exc:
        raise NotFound("No such request on this team.") from exc


# The operators' view of a request, for the events their consoles get.
_OPERATORS = Principal(kind="operator", operator_name="consoles")


def _announce_request(request: FrameRequest) -> None:
    """Tell operators and the team a request opened or settled: operators get its (masked) text;
    the team group, which any member may hear, gets the request without its text."""
    announce("team.request", request_summary(request, viewer=_OPERATORS))
    announce("team.request", request_summary(request, viewer=HUB), teams=[request.team_id], operators=False)


def request_summary(request: FrameRequest, *, viewer: Principal) -> dict[str, Any]:
    """One protocol request as `viewer` may see it (see `request_summaries`)."""
    return request_summaries([request], viewer=viewer)[0]


def request_summaries(requests: Sequence[FrameRequest], *, viewer: Principal) -> list[dict[str, Any]]:
    """Protocol requests as the API and live events show them to `viewer`.

    Kind, parties, state and times are the team's to see. The text is not: `payload` (and
    `reason` while open) was carried to the responder by the request frame, `reason` once
    answered to the requester by the answer frame, and each is shown only to who may read that
    frame: its author; its addressee once the frame's delivery could be pulled (it was queued,
    never only held, refused or denied); operators. A `reason` the hub wrote (expired, cancelled)
    is everyone's. Text from a frame in the sensitive tier comes masked (`mask_text`), to
    operators too: revealing a secret is the audited reveal of the message itself (`masked` says
    a secret was). A field kept back is null (`payload`) or empty (`reason`) and named in
    `withheld`."""
    if not requests:
        return []
    session_id = viewer.session.id if viewer.kind == "session" and viewer.session is not None else None
    reads = viewer.is_operator or session_id is not None
    pullable = _pullable(requests) if session_id is not None else set()
    sensitive = _sensitive(requests) if reads else set()
    return [_summary(r, viewer, session_id, pullable, sensitive) for r in requests]


def _summary(
    request: FrameRequest,
    viewer: Principal,
    session_id: Any,
    pullable: set[tuple[Any, Any]],
    sensitive: set[Any],
) -> dict[str, Any]:
    requester, responder = request.requester.session_id, request.responder.session_id

    def readable(author: Any, addressee: Any, carrier: Any) -> bool:
        if viewer.is_operator:
            return True
        if session_id is None:
            return False  # no one in particular: a team-wide event
        return session_id == author or (session_id == addressee and (carrier, addressee) in pullable)

    answered = request.state in (RequestState.APPROVED, RequestState.REJECTED)
    by_hub = request.state in (RequestState.EXPIRED, RequestState.CANCELLED)
    payload_carrier = request.request_message_id
    reason_carrier = request.response_message_id if answered else request.request_message_id
    show_payload = readable(requester, responder, payload_carrier)
    if by_hub:
        show_reason = True
    elif answered:
        show_reason = readable(responder, requester, reason_carrier)
    else:
        show_reason = readable(requester, responder, reason_carrier)

    # Text from a sensitive frame is masked, and so is text whose frame is gone (purged): its tier
    # is no longer known. `mask_text` leaves text with no secret in it as it is.
    def masks(carrier: Any) -> bool:
        return carrier is None or carrier in sensitive

    payload: Any = request.payload if show_payload else None
    reason = request.reason if show_reason else ""
    if show_payload and show_reason and not by_hub and reason_carrier == payload_carrier:
        if masks(payload_carrier):
            # One frame carried both: masked together, as that frame was classified.
            both = _masked({"payload": payload, "reason": reason})
            payload, reason = (both["payload"], both["reason"]) if isinstance(both, dict) else (both, "")
    else:
        if show_payload and masks(payload_carrier):
            payload = _masked(payload)
        if show_reason and not by_hub and masks(reason_carrier):
            reason = mask_text(reason)
    masked = (show_payload and payload != request.payload) or (show_reason and reason != request.reason)
    withheld = [name for name, shown in (("payload", show_payload), ("reason", show_reason)) if not shown]
    return {
        "id": str(request.id),
        "team_id": str(request.team_id),
        "kind": request.kind,
        "state": request.state,
        "requester": str(request.requester_id),
        "responder": str(request.responder_id),
        "reason": reason,
        "payload": payload,
        "masked": masked,
        "withheld": withheld,
        "message_id": str(request.request_message_id) if request.request_message_id else None,
        "created_at": request.created_at.isoformat() if request.created_at else None,
        "expires_at": request.expires_at.isoformat() if request.expires_at else None,
        "answered_at": request.answered_at.isoformat() if request.answered_at else None,
    }


def _carriers(requests: Iterable[FrameRequest]) -> set[Any]:
    ids = {r.request_message_id for r in requests} | {r.response_message_id for r in requests}
    ids.discard(None)
    return ids


def _pullable(requests: Iterable[FrameRequest]) -> set[tuple[Any, Any]]:
    """(message id, recipient session id) of each of these requests' frames that its recipient
    could pull: its delivery was queued (or relayed) at some point. One held and then denied, or
    expired while held, or refused, never was; one queued stays pullable for good (`queued_at`
    is written once, when it entered the inbox)."""
    carriers = _carriers(requests)
    if not carriers:
        return set()
    rows = Delivery.objects.filter(message_id__in=carriers).filter(
        Q(queued_at__isnull=False) | Q(relayed_at__isnull=False)
    )
    return set(rows.values_list("message_id", "recipient_id"))


def _sensitive(requests: Iterable[FrameRequest]) -> set[Any]:
    """Ids of these requests' frames classified in the sensitive tier."""
    carriers = _carriers(requests)
    if not carriers:
        return set()
    return set(Message.objects.filter(pk__in=carriers, tier=Tier.SENSITIVE).values_list("pk", flat=True))


def _masked(payload: Any) -> Any:
    """`payload` with its secrets masked. Masked as one JSON text, the way the frame carrying it
    was classified (a key in one field and its secret in another are found together); if masking
    broke the JSON apart, the masked text itself."""
    masked = mask_text(json.dumps(payload, ensure_ascii=False, sort_keys=True))
    try:
        return json.loads(masked)
    except ValueError:
        return masked
