"""Team and task tools for the MCP server, over the teams REST API (/api/v1/teams, /api/v1/tasks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer


def register_team_tools(server: MCPServer, hub: Callable[..., Any], answer: Callable[..., str]) -> None:
    """Add the team tools to `server` (wired to the teams API once it exists)."""
