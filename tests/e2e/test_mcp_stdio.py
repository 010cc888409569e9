"""`switchboard mcp` as a real stdio subprocess, driven by the official `mcp` client SDK, against a
real `switchboard serve` process: list, send, receive, ack, status, and a task claim."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters

from hub_topology import REPO
from hub_topology.embedded import Hub

pytestmark = pytest.mark.e2e


def text(result: Any) -> str:
    assert not result.is_error, result.content
    return "\n".join(block.text for block in result.content)


def data(result: Any) -> Any:
    return json.loads(text(result).split("\n", 1)[1])


def register(hub: Hub, name: str) -> dict[str, Any]:
    r = httpx.post(
        f"{hub.url}/api/v1/sessions",
        json={"name": name},
        headers={"Authorization": f"Bearer {hub.enroll_key}"},
    )
    assert r.status_code == 201, r.text
    return r.json()


def test_an_mcp_client_uses_the_hub_end_to_end(hub: Hub, tmp_path: Path) -> None:
    bob = register(hub, "bob")
    bob_api = httpx.Client(base_url=f"{hub.url}/api/v1", headers={"Authorization": f"Bearer {bob['token']}"})
    agent_home = tmp_path / "agent-home"
    agent_home.mkdir(mode=0o700)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "switchboard_agent.cli", "mcp"],
        cwd=str(REPO),
        env={
            "SWITCHBOARD_URL": hub.url,
            "SWITCHBOARD_ENROLL_KEY": hub.enroll_key,
            "SWITCHBOARD_HOME": str(agent_home),
            "SWITCHBOARD_NAME": "alice",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        },
    )
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(params, read_timeout_seconds=30) as client:
            tools = await client.list_tools()
            size = len(
                json.dumps([t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools.tools])
            )
            print(f"\nMCP over stdio: {len(tools.tools)} tools, {size:,} characters of tool schemas")
            seen["size"] = size

            seen["server"] = client.server_info
            listed = await client.call_tool("list_agents", {})
            seen["agents"] = data(listed)
            seen["structured"] = listed.structured_content
            sent = await client.call_tool(
                "send_message", {"to": "bob", "message": "Can you take the API docs?"}
            )
            seen["sent"] = text(sent)
            sent_id = data(sent)["id"]

            pulled = bob_api.get("inbox").json()["messages"]
            assert [m["id"] for m in pulled] == [sent_id]
            reply = bob_api.post(
                "messages", json={"to": "alice", "message": "Yes, on it.", "in_reply_to": sent_id}
            )
            seen["reply_id"] = reply.json()["id"]

            seen["inbox"] = text(await client.call_tool("check_inbox", {"wait": 5}))
            seen["ack"] = text(await client.call_tool("ack", {"ids": [seen["reply_id"]]}))
            bob_api.post("inbox/ack", json={"ids": [sent_id]})
            seen["status"] = data(await client.call_tool("message_status", {"id": sent_id}))

            await client.call_tool("create_team", {"name": "docs"})
            # Bob asks to join, so the lead's add_member puts it on the roster at once.
            assert bob_api.post("teams/join", json={"lead": "alice"}).status_code == 202
            await client.call_tool("add_member", {"session": "bob"})
            task = data(await client.call_tool("create_task", {"title": "Write the API docs"}))
            claimed = bob_api.post(f"tasks/{task['id']}/claim", json={})
            assert claimed.status_code == 200, claimed.text
            seen["board"] = data(await client.call_tool("list_tasks", {}))
            seen["second_claim"] = await client.call_tool("claim_task", {"task_id": task["id"]})
            await client.call_tool("create_task", {"title": "Review the API docs"})
            seen["my_claim"] = text(await client.call_tool("claim_task", {"task_id": 0}))

    anyio.run(session)

    assert seen["size"] < 10_000
    assert seen["server"].version  # the package's version, not ""
    assert seen["structured"]["agents"] == seen["agents"]  # structured content beside the sentence
    names = [a["name"] for a in seen["agents"]]  # (hubs federated on this machine may add theirs)
    assert "bob" in names and "alice" not in names
    assert seen["sent"].startswith(f"Queued for bob [{bob['ref']}]")
    assert '[SWITCHBOARD FROM="bob"' in seen["inbox"] and "Yes, on it." in seen["inbox"]
    assert seen["ack"].startswith("1 of 1")
    assert seen["status"]["status"] == "read"
    assert [e["event"] for e in seen["status"]["history"]][-3:] == [
        "delivery.queued",
        "delivery.delivered",
        "delivery.read",
    ]
    assert seen["board"][0]["status"] == "in_progress" and seen["board"][0]["owner"]["name"] == "bob"
    assert seen["second_claim"].is_error  # one winner: bob already holds it
    assert "do not retry unchanged" in seen["second_claim"].content[0].text.lower()
    assert seen["my_claim"].startswith("You own task") and "Review the API docs" in seen["my_claim"]
    everyone = bob_api.get("agents", params={"include_exited": "true"}).json()["agents"]
    assert {a["name"]: a["status"] for a in everyone}["alice"] == "exited"  # deregistered on exit
