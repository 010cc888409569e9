"""The agent side of Switchboard: an HTTP client for the hub and the surfaces built on it
(CLI commands, the MCP server, Claude Code hooks, the socket listener).

Nothing here imports Django: these run inside agent processes and hook calls, which must start fast
and must work against a hub on another machine.
"""
