"""A stand-in for an agent client process (Claude Code, Gemini CLI, Codex CLI), for tests that need
the real process tree: it runs hook commands as those clients do (through a shell, the event's JSON
on stdin, or Codex's notify with the JSON as the last argument) and runs `switchboard mcp` as its
own stdio child, driven by the official MCP client SDK.

It reads one JSON command per line on stdin and answers one JSON line on stdout:
- {"op": "hook", "command": "<shell line>", "stdin": "<json>", "env": {...}, "shell": [...]}
    → {"code", "stdout", "seconds"} (the shell runs the line: `sh -c` as Claude Code and Gemini CLI
    do by default; Codex runs `$SHELL -lc`)
- {"op": "notify", "argv": [...], "payload": "<json>", "env": {...}} → {"code", "seconds"}
- {"op": "mcp_start", "argv": [...], "env": {...}} → {"ok": true}
- {"op": "mcp_call", "tool": "...", "args": {...}} → {"is_error", "text"}
- {"op": "quit"} → exits (closing the MCP server)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import anyio
from mcp import Client, StdioServerParameters


def answer(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def run_hook(command: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, **command.get("env", {})}
    started = time.perf_counter()
    if command["op"] == "notify":  # Codex: argv plus the JSON as its last argument, no stdin
        done = subprocess.run(
            [*command["argv"], command["payload"]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    else:  # a shell runs the line, the event's JSON on stdin
        done = subprocess.run(
            [*command.get("shell", ["/bin/sh", "-c"]), command["command"]],
            input=command.get("stdin", ""),
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    return {"code": done.returncode, "stdout": done.stdout, "seconds": time.perf_counter() - started}


async def main() -> None:
    client: Client | None = None
    stack: Any = None
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            break
        command = json.loads(line)
        op = command["op"]
        if op in ("hook", "notify"):
            answer(await anyio.to_thread.run_sync(run_hook, command))
        elif op == "mcp_start":
            params = StdioServerParameters(
                command=command["argv"][0],
                args=command["argv"][1:],
                env={**os.environ, **command.get("env", {})},
            )
            stack = Client(params, read_timeout_seconds=30)
            client = await stack.__aenter__()
            answer({"ok": True})
        elif op == "mcp_call":
            assert client is not None
            result = await client.call_tool(command["tool"], command.get("args", {}))
            text = "\n".join(getattr(block, "text", "") for block in result.content)
            answer({"is_error": bool(result.is_error), "text": text})
        elif op == "quit":
            break
    if stack is not None:
        await stack.__aexit__(None, None, None)
    answer({"bye": True})


class Stub:
    """The test side: start a stub client process and send it commands."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )

    def send(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the stub client process died"
        return json.loads(line)

    def hook(
        self, command: str, payload: dict[str, Any], *, shell: list[str] | None = None, **env: str
    ) -> dict[str, Any]:
        out = self.send(
            op="hook", command=command, stdin=json.dumps(payload), env=env, shell=shell or ["/bin/sh", "-c"]
        )
        out["answer"] = json.loads(out["stdout"]) if out["stdout"].strip() else None
        return out

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send(op="quit")
                self.process.wait(timeout=15)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=5)


if __name__ == "__main__":
    anyio.run(main)
