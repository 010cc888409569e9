"""The one write path. Every surface (REST, MCP, CLI, console, consumers, tasks) calls these."""
