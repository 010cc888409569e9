"""The next step a hub answer names (its `hint` code, see `messaging.hints`), worded for where the
text is read: an MCP client's model gets a tool's name, a shell a command that works there."""

from __future__ import annotations

import shlex
from collections.abc import Callable

# code → (what to do, the MCP tool that does it, the `switchboard` subcommand that does it)
STEPS: dict[str, tuple[str, str, str]] = {
    "message_status": ("Check its state with", "message_status", "status {id}"),
    "list_agents": ("List sessions with", "list_agents", "agents"),
}


def for_tools(code: str | None) -> str:
    """The step as a model using the MCP tools reads it (" Check its state with ..."), or ""."""
    if code not in STEPS:
        return ""
    what, tool, _ = STEPS[code]
    return f" {what} the {tool} tool."


def for_shell(code: str | None, command: Callable[[str], str], **values: str) -> str:
    """The step as a shell command; `command` turns a subcommand into the full command line (with
    the --session and --url the caller used), `values` fill the subcommand's blanks."""
    if code not in STEPS:
        return ""
    what, _, sub = STEPS[code]
    return f" {what} `{command(sub.format(**values))}`."


def reread(session_key: str) -> str:
    """How a model whose messages were injected by the hooks reads one in full: the MCP tool, or the
    CLI acting as the hooks' saved session (the agent's own shell has no SWITCHBOARD_TOKEN)."""
    session = f" --session {shlex.quote(session_key)}" if session_key else ""
    return (
        "read it in full with the Switchboard check_inbox tool (include_unacked) or "
        f"`switchboard inbox --unacked{session}`"
    )
