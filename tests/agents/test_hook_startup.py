"""`switchboard hook` starts on every tool call of every agent, so what it imports is paid each time:
the common case (a PostToolUse with a saved session, nothing waiting) must import only what it
uses. A real hook process, against a stub hub on 127.0.0.1, reports every module it imported
(`python -X importtime`); the heavy ones the agent side has elsewhere must not be among them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.agents.test_hook_deadlines import payload, save_session

REPO = Path(__file__).resolve().parents[2]
# What a hook never needs: another HTTP client, the MCP SDK and what it brings, the install code,
# the package metadata machinery (the hub's commands only).
HEAVY = (
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "mcp",
    "mcp_types",
    "pydantic",
    "pydantic_core",
    "starlette",
    "tomlkit",
    "click",
    "rich",
    "importlib.metadata",
    "urllib.request",
    "switchboard_agent.mcp_server",
    "switchboard_agent.teams_tools",
    "switchboard_agent.install",
    "switchboard_agent.listen",
)


class EmptyInbox(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    paths: list[str] = []

    def do_GET(self) -> None:
        EmptyInbox.paths.append(self.path)
        body = json.dumps({"messages": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub_hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EmptyInbox)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    EmptyInbox.paths = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_post_tool_use_hook_imports_nothing_heavy(
    stub_hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    save_session(tmp_path, stub_hub)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_"))}
    env |= {"SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_URL": stub_hub}

    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "switchboard_agent.cli", "hook"],
        input=payload("PostToolUse"),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )

    assert done.returncode == 0 and done.stdout == ""
    assert "PostToolUse: ok; 1 request(s)" in (tmp_path / "agent.log").read_text()  # it asked the hub
    assert [p.partition("?")[0] for p in EmptyInbox.paths] == ["/api/v1/inbox"]
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", done.stderr, re.MULTILINE))
    assert "switchboard_agent.hooks" in imported  # the report is read right
    heavy = sorted(m for m in imported if any(m == h or m.startswith(f"{h}.") for h in HEAVY))
    assert heavy == [], f"the hook imported {heavy}"
