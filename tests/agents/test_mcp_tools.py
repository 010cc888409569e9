"""The MCP server's tools, driven by the official `mcp` client in-process against an in-process hub.
(tests/e2e/test_mcp_stdio.py drives the same server over stdio against a real hub process.)"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp import Client

from messaging.models import AgentSession, Delivery
from switchboard_agent.identity import Identity
from switchboard_agent.mcp_server import build_server, tool_schema_size

pytestmark = pytest.mark.django_db(transaction=True)  # tools run in worker threads


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


def test_the_tool_schemas_stay_small() -> None:
    server = build_server(Identity(token="sbs_unused"))

    size = anyio.run(tool_schema_size, server)
    tools = anyio.run(server.list_tools)

    print(f"\nMCP tool schemas: {len(tools)} tools, {size:,} characters in total")
    assert size < 10_000
    assert {t.name for t in tools} >= {
        "list_agents", "send_message", "check_inbox", "ack", "message_status", "set_status",
        "notify_when_idle", "create_team", "add_member", "create_task", "list_tasks", "claim_task",
        "update_task", "shutdown_request", "shutdown_response", "join_team", "answer_invitation",
        "withdraw_join_request", "allow_watcher",
    }  # fmt: skip
    assert all(len(t.description or "") <= 200 for t in tools)


def test_an_agent_lists_sends_receives_acks_and_works_the_task_board(
    inprocess_hub: str, api, register, send, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_NAME", "alice")
    bob = register("bob")
    identity = Identity(cwd="/work/alice")
    server = build_server(identity)
    seen: dict[str, str] = {}

    async def session() -> None:
        async with Client(server) as client:
            agents = text(await client.call_tool("list_agents", {}))
            seen["agents"] = agents

            sent = await client.call_tool("send_message", {"to": "bob", "message": "review PR 7?"})
            seen["sent"] = text(sent)

            reply = await anyio.to_thread.run_sync(lambda: send(bob, "alice", "Approved, merge it."))
            seen["reply_id"] = reply.json_body["id"]
            seen["inbox"] = text(await client.call_tool("check_inbox", {}))
            seen["ack"] = text(await client.call_tool("ack", {"ids": [seen["reply_id"]]}))
            sent_id = json.loads(seen["sent"].split("\n", 1)[1])["id"]
            seen["status"] = text(await client.call_tool("message_status", {"id": sent_id}))

            seen["team"] = text(await client.call_tool("create_team", {"name": "billing"}))
            # Bob asks to join, so the lead's add_member puts it on the roster at once.
            asked = await anyio.to_thread.run_sync(
                lambda: api.post("teams/join", bob.token, {"lead": "alice"})
            )
            assert asked.status_code == 202, asked.json_body
            seen["member"] = text(await client.call_tool("add_member", {"session": "bob"}))
            seen["task"] = text(await client.call_tool("create_task", {"title": "Fix rounding"}))
            seen["claim"] = text(await client.call_tool("claim_task", {"task_id": 0}))
            task_id = json.loads(seen["claim"].split("\n", 1)[1])["id"]
            done = await client.call_tool(
                "update_task", {"task_id": task_id, "status": "completed", "result": "ok"}
            )
            seen["done"] = text(done)
            seen["board"] = text(await client.call_tool("list_tasks", {"status": "completed"}))

            missing = await client.call_tool("send_message", {"to": "nobody-here", "message": "hi"})
            assert missing.is_error
            seen["missing"] = text(missing)
            seen["idle"] = text(
                await client.call_tool("set_status", {"status": "idle", "final_answer": "done"})
            )

    anyio.run(session)

    assert '"name":"bob"' in seen["agents"] and '"name":"alice"' not in seen["agents"]
    assert seen["sent"].startswith(f"Queued for bob [{bob.ref}]")
    assert '[SWITCHBOARD FROM="bob"' in seen["inbox"] and "Approved, merge it." in seen["inbox"]
    assert seen["ack"].startswith("1 of 1 message(s) are now marked read.")
    assert Delivery.objects.get(message_id=seen["reply_id"]).state == "read"
    assert seen["status"].startswith("Message ") and "is queued." in seen["status"].split("\n")[0]
    assert seen["member"].startswith("bob joined the team.")
    assert seen["claim"].startswith("You own task")
    assert seen["done"].startswith(
        f"Task {json.loads(seen['claim'].split(chr(10), 1)[1])['id']} is completed"
    )
    assert '"title":"Fix rounding"' in seen["board"]
    assert "[not_found]" in seen["missing"] and "do not retry unchanged" in seen["missing"]
    assert seen["idle"].startswith("Your status on the hub is now idle.")
    alice = AgentSession.objects.get(name="alice")
    assert (alice.kind, alice.status) == ("mcp", "exited")  # registered on start, deregistered on exit


def test_an_agent_asks_to_join_lists_its_request_and_withdraws_it(
    inprocess_hub: str, api, register, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_NAME", "asker")
    lead = register("boss")
    assert api.post("teams", lead.token, {"name": "core"}).status_code == 201
    server = build_server(Identity(cwd="/work/asker"))
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(server) as client:
            seen["asked"] = (await client.call_tool("join_team", {"lead": "boss"})).structured_content
            seen["listed"] = (await client.call_tool("withdraw_join_request", {})).structured_content
            request = {"request_id": seen["asked"]["request_id"]}
            seen["withdrawn"] = text(await client.call_tool("withdraw_join_request", request))
            seen["after"] = (await client.call_tool("withdraw_join_request", {})).structured_content

    anyio.run(session)

    assert seen["asked"]["result"].startswith("Asked boss to add you")
    assert [r["id"] for r in seen["listed"]["requests"]] == [seen["asked"]["request_id"]]
    assert seen["withdrawn"].startswith("Request withdrawn")
    assert seen["after"]["requests"] == []
    assert api.get("teams/invitations", lead.token).json_body["invitations"] == []


def test_a_lead_pages_through_more_requests_to_join_than_one_page(
    inprocess_hub: str, api, register, monkeypatch: pytest.MonkeyPatch
) -> None:
    """answer_invitation with no id lists a page and the `next` to pass as `before` for the rest."""
    monkeypatch.setattr("teams.services.invitations.INVITATIONS_PAGE", 2)
    monkeypatch.setenv("SWITCHBOARD_NAME", "boss")
    server = build_server(Identity(cwd="/work/boss"))
    pages: list[dict[str, Any]] = []

    async def session() -> None:
        async with Client(server) as client:
            await client.call_tool("create_team", {"name": "core"})
            lead = await anyio.to_thread.run_sync(lambda: AgentSession.objects.get(name="boss"))
            for n in range(3):
                asker = await anyio.to_thread.run_sync(register, f"asker-{n}")
                await anyio.to_thread.run_sync(api.post, "teams/join", asker.token, {"lead": str(lead.id)})
            pages.append((await client.call_tool("answer_invitation", {})).structured_content)
            following = {"before": pages[0]["next"]}
            pages.append((await client.call_tool("answer_invitation", following)).structured_content)

    anyio.run(session)

    first, last = pages
    assert f"more: answer_invitation with before='{first['next']}'" in first["result"]
    assert "next" not in last and "more" not in last["result"]
    names = [i["session_label"].split()[0] for page in pages for i in page["invitations"]]
    assert names == ["asker-2", "asker-1", "asker-0"]  # newest first, each once


def test_a_hub_that_is_down_gives_a_retry_sentence(db, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "k")
    server = build_server(Identity(url="http://127.0.0.1:9", cwd="/work/x"))

    async def call() -> Any:
        async with Client(server) as client:
            return await client.call_tool("list_agents", {})

    result = anyio.run(call)

    assert result.is_error
    assert "retry in a few seconds" in text(result)


def test_with_hooks_installed_the_mcp_server_acts_as_the_hooks_session(
    inprocess_hub: str, monkeypatch
) -> None:
    import io

    from switchboard_agent.hooks import run_hook

    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)

    def fire(session_id: str, name: str, **fields: Any) -> None:
        payload = {"session_id": session_id, "cwd": "/work/billing", "hook_event_name": name, **fields}
        assert run_hook(io.StringIO(json.dumps(payload)), io.StringIO()) == 0

    fire("first-session", "SessionStart", source="startup")
    identity = Identity(cwd="/work/billing", attach_to_hooks=True)  # tied by process (no session id)

    me = identity.call(lambda c: c.me())
    assert me["name"] == "billing" and AgentSession.objects.count() == 1  # no second registration
    fire("first-session", "SessionEnd", reason="clear")  # /clear: a new Claude Code session follows
    fire("second-session", "SessionStart", source="clear")

    again = identity.call(lambda c: c.me())  # /clear keeps the hub session (and the ref peers pinned)

    assert again["id"] == me["id"] and again["ref"] == me["ref"] and again["status"] == "idle"
    assert AgentSession.objects.count() == 1 and not identity.owned
    identity.close()
    assert AgentSession.objects.get(pk=again["id"]).status == "idle"  # not ours to deregister


@pytest.mark.parametrize("client", ["claude", "gemini", "codex"])
def test_under_a_home_others_can_write_each_tool_says_why_and_what_to_tell_the_user(
    tmp_path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """The hooks' SessionStart tells the user; a tool the model calls all the same answers the same
    problem and fix (home.UnsafeHome), for the model to pass on, instead of the SDK's bare "Error
    executing tool". (A server without hooks, given its hub and key, keeps nothing in the home.)"""
    home = tmp_path / "sb"
    home.mkdir()
    home.chmod(0o777)
    monkeypatch.setenv("SWITCHBOARD_HOME", str(home))
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "k")
    identity = Identity(
        url="http://127.0.0.1:9",
        cwd="/work/x",
        attach_to_hooks=True,
        client_key="s1" if client == "claude" else None,
        owns_client_session=client == "codex",
    )
    server = build_server(identity)

    async def call() -> Any:
        async with Client(server) as client:
            return await client.call_tool("send_message", {"to": "bob", "message": "hi"})

    result = anyio.run(call)

    assert result.is_error
    said = text(result)
    assert "Switchboard is not connected" in said and f"chmod 0700 {home}" in said
    assert "your user" in said
