"""Shutdown negotiation: the lead asks, the teammate approves (its session stops) or says no and why.

An unanswered request expires at its deadline into a clear state (`expired`), and the lead is told
once that the teammate is still running. Nothing retries by itself, so the handshake never loops.
"""

from __future__ import annotations

from typing import Any

from messaging.principals import Principal
from teams.models import Team
from teams.services.frames import FrameResult, frame_send, requests_expire_due


def shutdown_request(*, team: Team, actor: Principal, to_member: Any, reason: str = "") -> FrameResult:
    """The lead asks a teammate to shut down. Asking again while one is open returns the open one."""
    return frame_send(
        team=team, actor=actor, frame_type="shutdown_request", to_member=to_member, reason=reason
    )


def shutdown_respond(
    *, team: Team, actor: Principal, request_id: Any, approve: bool, reason: str = ""
) -> FrameResult:
    """The teammate answers: approve (its session moves to `stopped`) or reject with a reason."""
    return frame_send(
        team=team,
        actor=actor,
        frame_type="shutdown_response",
        request_id=request_id,
        approve=approve,
        reason=reason,
    )


def shutdowns_expire_due(*, now: Any = None) -> int:
    """Periodic: settle every protocol request past its deadline. Returns how many closed."""
    return len(requests_expire_due(now=now))
