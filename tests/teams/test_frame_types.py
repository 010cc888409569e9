"""Frame types have one home (messaging.frame_types): the typed team API's rules cover exactly the
types members send, and plain text that parses as any protocol frame is refused."""

from __future__ import annotations

import json

from messaging.frame_types import HUB_FRAME_TYPES, MEMBER_FRAME_TYPES, PROTOCOL_FRAME_TYPES
from messaging.services.sending import looks_like_protocol_frame
from teams.services.frames import FRAME_RULES, FRAME_TYPES, HUB_ONLY_FRAMES


def test_the_team_api_has_a_rule_for_each_frame_a_member_sends_and_none_for_the_hubs_own() -> None:
    assert set(FRAME_RULES) == MEMBER_FRAME_TYPES
    assert HUB_ONLY_FRAMES == HUB_FRAME_TYPES and not HUB_FRAME_TYPES & MEMBER_FRAME_TYPES
    assert FRAME_TYPES <= PROTOCOL_FRAME_TYPES


def test_plain_text_that_parses_as_any_protocol_frame_is_refused() -> None:
    assert {
        "shutdown_request",
        "shutdown_response",
        "shutdown_approved",
        "shutdown_rejected",
        "plan_approval_request",
        "plan_approval_response",
        "permission_request",
        "permission_response",
        "sandbox_permission_request",
        "sandbox_permission_response",
        "mode_change",
        "task_assignment",
        "task_completed",
        "idle_notification",
        "team_permission_update",
        "teammate_terminated",
    } == PROTOCOL_FRAME_TYPES
    for frame_type in PROTOCOL_FRAME_TYPES:
        assert looks_like_protocol_frame(json.dumps({"type": frame_type.upper(), "x": 1}))
    assert not looks_like_protocol_frame(json.dumps({"type": "note"}))
