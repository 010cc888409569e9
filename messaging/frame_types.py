"""Team protocol frame types: the one list of them.

A frame is a typed message between the members of a team (`Message.kind` `frame`, its type in
`Message.frame_type`), sent through the typed team API (`teams.services.frames`) or written by the
hub. Plain text that parses as a frame of any protocol type is refused by the send service
(`messaging.services.sending.looks_like_protocol_frame`), so text can never pass for one.
"""

from __future__ import annotations

from enum import StrEnum


class FrameType(StrEnum):
    # Sent by a team's members through the typed API (who may send which: teams.services.frames).
    SHUTDOWN_REQUEST = "shutdown_request"
    SHUTDOWN_RESPONSE = "shutdown_response"
    PLAN_APPROVAL_REQUEST = "plan_approval_request"
    PLAN_APPROVAL_RESPONSE = "plan_approval_response"
    PERMISSION_REQUEST = "permission_request"
    PERMISSION_RESPONSE = "permission_response"
    MODE_CHANGE = "mode_change"
    # Written by the hub only: on a task's assignment and at a teammate's turn end.
    TASK_ASSIGNMENT = "task_assignment"
    IDLE_NOTIFICATION = "idle_notification"
    # Frames of the agents' own team protocol that this hub does not carry.
    SHUTDOWN_APPROVED = "shutdown_approved"
    SHUTDOWN_REJECTED = "shutdown_rejected"
    SANDBOX_PERMISSION_REQUEST = "sandbox_permission_request"
    SANDBOX_PERMISSION_RESPONSE = "sandbox_permission_response"
    TASK_COMPLETED = "task_completed"
    TEAM_PERMISSION_UPDATE = "team_permission_update"
    TEAMMATE_TERMINATED = "teammate_terminated"


F = FrameType
# The frames members send through the typed team API.
MEMBER_FRAME_TYPES = frozenset(
    {
        F.SHUTDOWN_REQUEST,
        F.SHUTDOWN_RESPONSE,
        F.PLAN_APPROVAL_REQUEST,
        F.PLAN_APPROVAL_RESPONSE,
        F.PERMISSION_REQUEST,
        F.PERMISSION_RESPONSE,
        F.MODE_CHANGE,
    }
)
# The frames only the hub writes.
HUB_FRAME_TYPES = frozenset({F.TASK_ASSIGNMENT, F.IDLE_NOTIFICATION})
# Every frame type of the team protocol: plain text that parses as one of them is refused.
PROTOCOL_FRAME_TYPES = frozenset(FrameType)
