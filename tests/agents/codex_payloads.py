"""Codex CLI's hook input, as its source declares it
(codex-rs/hooks/schema/generated/*.command.input.schema.json): what the tests feed `switchboard hook`."""

from __future__ import annotations

from typing import Any

THREAD = "019d036d-c7fa-72d2-b6fd-78878bfe34e4"  # a Codex thread id (its session_id)
TURN = "019d036e-0000-7000-8000-000000000001"


def codex_event(name: str, thread: str = THREAD, **fields: Any) -> dict[str, Any]:
    """The input of Codex hook event `name` in `thread`; every event but SessionStart is in a turn."""
    base = {
        "session_id": thread,
        "transcript_path": None,
        "cwd": "/work/api",
        "hook_event_name": name,
        "model": "gpt-5-codex",
        "permission_mode": "default",
    }
    if name != "SessionStart":
        base["turn_id"] = TURN
    return base | fields
