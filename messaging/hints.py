"""What a caller should do next, named by a stable code the hub puts beside its sentence (`hint` in
a send's answer and in an error's body). The hub's sentences name no route and no tool: each
surface words the step for where its text is read (the REST docs, the MCP tools, the CLI)."""

from __future__ import annotations

CHECK_STATUS = "message_status"  # REST: GET /api/v1/messages/{id}
LIST_AGENTS = "list_agents"  # REST: GET /api/v1/agents
