"""The MCP server answers its client at once whatever the hub does: it registers its session in
the background, so a hub that accepts connections and never answers cannot hold up the agent
client's start (Codex waits for a `required` server before its first model request)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from hub_topology.hung import HungHub
from switchboard_agent.identity import Identity
from switchboard_agent.mcp_server import build_server

READY_WITHIN = 2.0  # the registration's own read timeout is 10 s


@pytest.fixture
def hung() -> Iterator[HungHub]:
    with HungHub() as hub:
        yield hub


@pytest.mark.parametrize("client", ["", "codex"])
def test_the_server_is_ready_while_its_registration_waits_on_a_hung_hub(
    hung: HungHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "k" * 32)
    monkeypatch.setenv("SWITCHBOARD_CLIENT", client)
    monkeypatch.delenv("SWITCHBOARD_ATTACH", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    identity = Identity.from_env(url=hung.url, cwd=str(tmp_path))
    seen: dict[str, float] = {}

    async def session() -> None:
        started = time.perf_counter()
        async with Client(build_server(identity)) as mcp:
            tools = await mcp.list_tools()
            seen["ready"] = time.perf_counter() - started
            seen["tools"] = len(tools.tools)

    anyio.run(session)

    assert seen["tools"] > 10
    assert seen["ready"] < READY_WITHIN, f"ready after {seen['ready']:.1f} s"
    assert hung.accepted >= 1  # the registration did start, and is still waiting
