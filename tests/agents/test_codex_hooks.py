"""Codex CLI's hooks (`switchboard hook --client codex`) and its MCP server share one hub session per
Codex process, with the payloads Codex sends (codex-rs/hooks/schema/generated/*.command.input.schema.json)
and the answers its schemas take (`*.command.output.schema.json`). Codex passes its MCP servers no
session id, so the tie is the Codex process (here the in-process stand-in `4242:1`, see conftest).

tests/agents/test_install_clients.py drives the same through the written config.toml, a real hub
process and a real process tree."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hub_topology import wait_until
from messaging.models import AgentSession
from switchboard_agent.client import HubClient
from switchboard_agent.hooks import run_hook
from switchboard_agent.identity import Identity, runs_conversations
from tests.agents.codex_payloads import THREAD, codex_event

AFTER_CLEAR = "019d036e-3164-72c3-a170-98925564c4fc"


def hook(payload: dict[str, Any]) -> dict[str, Any] | None:
    stdout = io.StringIO()
    assert run_hook(io.StringIO(json.dumps(payload)), stdout, client_name="codex") == 0
    out = stdout.getvalue()
    return json.loads(out) if out else None


def codex_mcp_server() -> Identity:
    """The MCP server as Codex starts it (`SWITCHBOARD_CLIENT=codex`, `SWITCHBOARD_ATTACH=hooks`)."""
    identity = Identity(cwd="/work/api", attach_to_hooks=True, owns_client_session=True, kind="codex")
    identity.start()
    return identity


@pytest.fixture(autouse=True)
def _named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_TOKEN", raising=False)
    monkeypatch.setenv("SWITCHBOARD_NAME", "api")


@pytest.fixture
def peer(inprocess_hub: str) -> HubClient:
    client = HubClient(inprocess_hub, None)
    client.token = client.register(name="bob")["token"]
    return client


@pytest.mark.parametrize("mcp_first", [True, False], ids=["mcp-server-first", "hooks-first"])
def test_the_mcp_server_and_the_hooks_of_one_codex_process_are_one_session(
    inprocess_hub: str, mcp_first: bool
) -> None:
    server = codex_mcp_server() if mcp_first else None
    started = hook(codex_event("SessionStart", source="startup"))
    server = server or codex_mcp_server()

    session = AgentSession.objects.get(name="api")
    assert session.kind == "codex" and server.session["ref"] == session.ref
    assert session.status == "idle"  # Codex sits at its prompt until the first turn starts
    assert started is not None
    context = started["hookSpecificOutput"]
    assert context["hookEventName"] == "SessionStart"
    assert f"api [{session.ref}]" in context["additionalContext"]
    server.close()  # Codex exits: its MCP server ends the session, whoever registered it
    session.refresh_from_db()
    assert session.status == "exited"


def test_messages_reach_codex_between_steps_and_stop_reports_the_final_answer(
    inprocess_hub: str, peer: HubClient
) -> None:
    server = codex_mcp_server()
    hook(codex_event("SessionStart", source="startup"))
    assert hook(codex_event("UserPromptSubmit", prompt="build it")) is None
    peer.send(to="api", message="The build needs --locked.")

    tool = hook(
        codex_event(
            "PostToolUse",
            tool_name="Bash",
            tool_input={"command": "cargo build"},
            tool_response="Finished `dev` profile",
            tool_use_id="call_01",
        )
    )
    assert tool is not None
    assert tool["hookSpecificOutput"]["hookEventName"] == "PostToolUse"
    assert "The build needs --locked." in tool["hookSpecificOutput"]["additionalContext"]

    peer.send(to="api", message="And run the tests.")
    stop = codex_event("Stop", stop_hook_active=False, last_assistant_message="Built.")
    kept = hook(stop)
    assert kept is not None and kept["decision"] == "block"  # Codex's word; the reason is the next prompt
    assert "And run the tests." in kept["reason"]
    assert AgentSession.objects.get(name="api").status == "busy"

    assert hook(stop | {"stop_hook_active": True, "last_assistant_message": "Built; tests pass."}) is None
    session = AgentSession.objects.get(name="api")
    assert (session.status, session.final_answer) == ("idle", "Built; tests pass.")

    prompt = hook(codex_event("UserPromptSubmit", prompt="now the docs"))
    assert prompt is None and AgentSession.objects.get(name="api").status == "busy"
    server.close()


def test_clear_keeps_the_codex_process_s_hub_session(inprocess_hub: str) -> None:
    server = codex_mcp_server()
    hook(codex_event("SessionStart", source="startup"))
    ref = server.session["ref"]

    cleared = hook(codex_event("SessionStart", AFTER_CLEAR, source="clear"))

    assert cleared is not None and f"[{ref}]" in cleared["hookSpecificOutput"]["additionalContext"]
    assert AgentSession.objects.filter(kind="codex").count() == 1
    server.close()


def test_a_codex_exec_session_is_bypass_once_its_first_hook_says_so(
    inprocess_hub: str, peer: HubClient
) -> None:
    """The MCP server registers the session before any hook runs and cannot tell the mode; `codex
    exec` then passes every hook `permission_mode` `bypassPermissions` (0.171): the first hook
    tells the hub, so peers' messages to an agent that runs without asking are held."""
    server = codex_mcp_server()
    assert AgentSession.objects.get(name="api").permission_mode == "default"

    hook(codex_event("SessionStart", source="startup", permission_mode="bypassPermissions"))

    assert AgentSession.objects.get(name="api").permission_mode == "bypass"
    assert peer.send(to="api", message="run the migration")["status"] == "held"
    hook(codex_event("UserPromptSubmit", prompt="go", permission_mode="bypassPermissions"))
    server.close()


def test_a_session_stays_bypass_when_a_later_hook_reports_default(
    inprocess_hub: str, peer: HubClient
) -> None:
    server = codex_mcp_server()
    hook(codex_event("SessionStart", source="startup", permission_mode="bypassPermissions"))

    hook(codex_event("UserPromptSubmit", prompt="go", permission_mode="default"))

    assert AgentSession.objects.get(name="api").permission_mode == "bypass"
    server.close()


def test_an_interrupted_turn_shows_idle_and_leaves_what_waits_queued(
    inprocess_hub: str, peer: HubClient
) -> None:
    """Esc in Codex ends the turn with its Interrupt hook, no Stop: the session goes idle with no
    final answer, a message that came in during the turn stays queued (Codex reads nothing back
    but `systemMessage`), and the next prompt reports busy again and hands the message over."""
    server = codex_mcp_server()
    hook(codex_event("SessionStart", source="startup"))
    hook(codex_event("UserPromptSubmit", prompt="build it"))
    hook(codex_event("Stop", stop_hook_active=False, last_assistant_message="Built."))
    hook(codex_event("UserPromptSubmit", prompt="and the docs"))
    peer.send(to="api", message="The docs live in docs/.")

    assert hook(codex_event("Interrupt")) is None

    session = AgentSession.objects.get(name="api")
    assert (session.status, session.final_answer) == ("idle", "")
    assert list(session.deliveries.values_list("state", flat=True)) == ["queued"]
    prompt = hook(codex_event("UserPromptSubmit", prompt="go on"))
    assert AgentSession.objects.get(name="api").status == "busy"
    assert (
        prompt is not None and "The docs live in docs/." in prompt["hookSpecificOutput"]["additionalContext"]
    )
    server.close()


def test_an_interrupt_registers_no_session(inprocess_hub: str) -> None:
    """An Interrupt with no session saved for this Codex process (its hub is new, or its hooks
    were installed mid-turn) reports nothing: only a turn's own hooks or the MCP server register."""
    assert hook(codex_event("Interrupt")) is None
    assert not AgentSession.objects.exists()


def test_an_interrupt_the_hub_no_longer_knows_registers_no_session(inprocess_hub: str) -> None:
    """The next turn's hooks register afresh (`Hook.with_session`); an interrupt does not."""
    hook(codex_event("UserPromptSubmit", prompt="build it"))
    AgentSession.objects.all().delete()  # the hub was reset

    assert hook(codex_event("Interrupt")) is None

    assert not AgentSession.objects.exists()


def test_a_codex_app_server_is_told_apart_from_a_codex_run_by_its_command_line() -> None:
    """`codex app-server ...` (the TUI's daemon) runs many conversations; any other process, such
    as `codex exec` or `codex --no-daemon`, runs one."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "app-server", "--listen"])
    try:
        # Its command line as the process shows it once it has started (bounded wait).
        wait_until(
            lambda: b"app-server" in Path(f"/proc/{server.pid}/cmdline").read_bytes(),
            timeout=10,
            what="the stand-in app server's start",
        )
        assert runs_conversations(f"{server.pid}:1")
        assert not runs_conversations(f"{os.getpid()}:1")
    finally:
        server.kill()
        server.wait(timeout=10)


OTHER_THREAD = "019d036f-0000-7000-8000-0000000000aa"  # another TUI's conversation, same app server


@pytest.fixture
def app_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hooks and MCP servers run under a Codex app server (the interactive TUI's daemon), which
    runs the conversations of every TUI of its user, each with an MCP server of its own."""
    monkeypatch.setattr("switchboard_agent.identity.runs_conversations", lambda anchor: True)
    monkeypatch.setattr("switchboard_agent.hooks.runs_conversations", lambda anchor: True)


def test_each_conversation_of_a_codex_app_server_is_a_hub_session_of_its_own(
    inprocess_hub: str, peer: HubClient, app_server: None
) -> None:
    """Two TUIs on one daemon: the hooks key each session by its conversation (`session_id`), each
    conversation's MCP server finds its own by the thread id of its first tool call (`_meta`), and
    ending one conversation's MCP server ends only that session."""
    servers = {thread: codex_mcp_server() for thread in (THREAD, OTHER_THREAD)}
    assert AgentSession.objects.filter(kind="codex").count() == 0  # no conversation named yet
    for thread in servers:
        hook(codex_event("SessionStart", thread, source="startup"))
        hook(codex_event("UserPromptSubmit", thread, prompt="hello"))
    for thread, server in servers.items():
        server.in_conversation(thread)  # its first tool call names it
        server.call(lambda client, t=thread: client.send(to="bob", message=f"from {t}"))
    hook(codex_event("Stop", THREAD, last_assistant_message="first done"))

    sessions = {s.ref: s for s in AgentSession.objects.filter(kind="codex")}
    assert len(sessions) == 2
    first, other = (sessions[servers[t].session["ref"]] for t in (THREAD, OTHER_THREAD))
    assert (first.status, first.final_answer) == ("idle", "first done")
    assert other.status == "busy"  # its turn goes on
    inbox = peer.inbox()
    assert sorted((m["text"], m["from"]["ref"]) for m in inbox) == sorted(
        [(f"from {THREAD}", first.ref), (f"from {OTHER_THREAD}", other.ref)]
    )
    servers[THREAD].close()
    first.refresh_from_db()
    other.refresh_from_db()
    assert (first.status, other.status) == ("exited", "busy")
    servers[OTHER_THREAD].close()
