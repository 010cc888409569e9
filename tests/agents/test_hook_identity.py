"""One hub identity per agent session: two Claude Code sessions in one folder, each with its real
`switchboard mcp` server (stdio) and hook processes, against a real `switchboard serve`; parallel
first hooks register one session; /clear and /resume keep the hub session."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hub_topology import REPO
from hub_topology.embedded import Hub
from messaging.models import AgentSession
from switchboard_agent.client import HubClient
from switchboard_agent.hooks import run_hook
from switchboard_agent.identity import client_anchor
from tests.agents.client_stub import Stub
from tests.agents.codex_payloads import codex_event

HOOK = f"{sys.executable} -m switchboard_agent.cli hook"
MCP = [sys.executable, "-m", "switchboard_agent.cli", "mcp"]
SID_A = "0d9a7c2e-aaaa-4b8a-9c3e-5a1b2c3d4e5f"
SID_B = "0d9a7c2e-bbbb-4b8a-9c3e-5a1b2c3d4e5f"
THIS_PROCESS = client_anchor(os.getpid())  # read before any test stands another process in for it
REGISTERED = re.compile(r"registered on the Switchboard hub as (.+) \[(\w+)\]")


def event(name: str, session_id: str, cwd: str = "/work/shop", **fields: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "transcript_path": f"/tmp/{session_id}.jsonl",
        "cwd": cwd,
        "permission_mode": "default",
        "hook_event_name": name,
        **fields,
    }


def agent_env(hub: Hub, home: Path) -> dict[str, str]:
    """The environment an agent client passes on: this hub, this home, and none of the caller's
    Switchboard or Claude Code variables (the tests may themselves run inside Claude Code)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWITCHBOARD_", "CLAUDE_CODE_", "CLAUDECODE", "DATABASE_URL", "REDIS_URL"))
    }
    return env | {
        "SWITCHBOARD_URL": hub.url,
        "SWITCHBOARD_ENROLL_KEY": hub.enroll_key,
        "SWITCHBOARD_HOME": str(home),
    }


def enroll(hub: Hub, name: str) -> dict[str, Any]:
    r = httpx.post(
        f"{hub.url}/api/v1/sessions",
        json={"name": name},
        headers={"Authorization": f"Bearer {hub.enroll_key}"},
    )
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.e2e
@pytest.mark.parametrize("tie", ["session id", "process"])
def test_two_claude_code_sessions_in_one_folder_each_send_as_their_own_session(
    hub_process: Hub, tmp_path: Path, tie: str
) -> None:
    """`session id`: Claude Code passes CLAUDE_CODE_SESSION_ID to the MCP server (2.1.154 on);
    `process`: it does not (older versions, other clients): the tie is the client process."""
    hub = hub_process
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    bob = enroll(hub, "bob")
    env = agent_env(hub, home)
    stubs = {sid: Stub(env, str(REPO)) for sid in (SID_A, SID_B)}
    try:
        me: dict[str, tuple[str, str]] = {}
        for sid, stub in stubs.items():  # A starts, then B in the same folder (B saves last)
            out = stub.hook(HOOK, event("SessionStart", sid, source="startup"), CLAUDE_CODE_SESSION_ID=sid)
            found = REGISTERED.search(out["answer"]["hookSpecificOutput"]["additionalContext"])
            assert found, out
            me[sid] = (found[1], found[2])
        assert me[SID_A][1] != me[SID_B][1]

        for sid, stub in stubs.items():
            mcp_env = {"SWITCHBOARD_ATTACH": "hooks"} | (
                {"CLAUDE_CODE_SESSION_ID": sid} if tie == "session id" else {}
            )
            assert stub.send(op="mcp_start", argv=MCP, env=mcp_env) == {"ok": True}
        for sid, stub in stubs.items():
            sent = stub.send(op="mcp_call", tool="send_message", args={"to": "bob", "message": f"from {sid}"})
            assert not sent["is_error"], sent

        bob_api = httpx.Client(
            base_url=f"{hub.url}/api/v1", headers={"Authorization": f"Bearer {bob['token']}"}
        )
        pulled = bob_api.get("inbox").json()["messages"]
        senders = {m["text"]: m["from"]["ref"] for m in pulled}
        assert senders == {f"from {SID_A}": me[SID_A][1], f"from {SID_B}": me[SID_B][1]}
        agents = bob_api.get("agents").json()["agents"]
        assert len(agents) == 3  # bob and the two sessions: the MCP servers registered none of their own
    finally:
        for stub in stubs.values():
            stub.close()


def test_an_mcp_server_that_cannot_tell_its_session_refuses_rather_than_guesses(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard_agent.config import SavedSession, session_save
    from switchboard_agent.identity import Identity

    # A session registered from another client process in this folder: not ours.
    session_save(
        SavedSession(key="other", hub=inprocess_hub, token="t", id="i", name="shop", ref="r", anchor="1:1")
    )
    identity = Identity(cwd="/work/shop", attach_to_hooks=True)

    with pytest.raises(Exception) as refused:
        identity.call(lambda c: c.me())

    assert getattr(refused.value, "code", "") == "no_agent_session"
    assert AgentSession.objects.count() == 0  # and it registered nothing of its own


@pytest.mark.e2e
@pytest.mark.e2e
def test_a_claude_code_and_a_gemini_cli_in_one_folder_each_send_as_their_own_session(
    hub_process: Hub, tmp_path: Path
) -> None:
    """Two different clients in the same folder, the Gemini CLI started from Claude Code's Bash
    tool (so it inherits CLAUDE_CODE_SESSION_ID): each client's hooks and MCP server act as its
    own session, the Gemini one never as the Claude Code session whose id it carries."""
    hub = hub_process
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    bob = enroll(hub, "bob")
    env = agent_env(hub, home)
    claude, gemini = Stub(env, str(REPO)), Stub(env | {"CLAUDE_CODE_SESSION_ID": SID_A}, str(REPO))
    try:
        out = claude.hook(HOOK, event("SessionStart", SID_A, source="startup"), CLAUDE_CODE_SESSION_ID=SID_A)
        mine = {"claude": REGISTERED.search(out["answer"]["hookSpecificOutput"]["additionalContext"])[2]}
        gemini_start = {
            k: v for k, v in event("SessionStart", SID_B, source="startup").items() if k != "permission_mode"
        }
        out = gemini.hook(f"{HOOK} --client gemini || true", gemini_start, shell=["bash", "-c"])
        mine["gemini"] = REGISTERED.search(out["answer"]["hookSpecificOutput"]["additionalContext"])[2]
        assert mine["claude"] != mine["gemini"]

        mcp_env = {"SWITCHBOARD_ATTACH": "hooks"}
        assert claude.send(op="mcp_start", argv=MCP, env=mcp_env | {"SWITCHBOARD_CLIENT": "claude"}) == {
            "ok": True
        }
        assert gemini.send(op="mcp_start", argv=MCP, env=mcp_env | {"SWITCHBOARD_CLIENT": "gemini"}) == {
            "ok": True
        }
        for name, stub in (("claude", claude), ("gemini", gemini)):
            sent = stub.send(
                op="mcp_call", tool="send_message", args={"to": "bob", "message": f"from {name}"}
            )
            assert not sent["is_error"], sent

        bob_api = httpx.Client(
            base_url=f"{hub.url}/api/v1", headers={"Authorization": f"Bearer {bob['token']}"}
        )
        senders = {m["text"]: m["from"]["ref"] for m in bob_api.get("inbox").json()["messages"]}
        assert senders == {"from claude": mine["claude"], "from gemini": mine["gemini"]}
        assert len(bob_api.get("agents").json()["agents"]) == 3  # bob and the two: nothing more registered
    finally:
        claude.close()
        gemini.close()


def test_three_parallel_first_hooks_register_one_session(hub_process: Hub, tmp_path: Path) -> None:
    """No saved session (the hub was down at SessionStart): three PostToolUse hooks at once."""
    hub = hub_process
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    env = agent_env(hub, home)
    payload = json.dumps(event("PostToolUse", SID_A, tool_name="Bash", tool_input={}, tool_use_id="toolu_1"))
    hooks = [
        subprocess.Popen(
            [sys.executable, "-m", "switchboard_agent.cli", "hook"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for _ in range(3)
    ]
    for process in hooks:  # all three read their event at once
        assert process.stdin is not None
        process.stdin.write(payload)
        process.stdin.close()
    for process in hooks:
        process.wait(timeout=30)
        assert process.stdout is not None and process.returncode == 0
        process.stdout.close()

    everyone = httpx.get(
        f"{hub.url}/api/v1/agents",
        params={"include_exited": "true"},
        headers={"Authorization": f"Bearer {enroll(hub, 'watcher')['token']}"},
    ).json()["agents"]
    assert sorted(a["name"] for a in everyone) == ["shop", "watcher"]
    saved = json.loads((home / "sessions" / f"{SID_A}.json").read_text())
    assert saved["name"] == "shop"


def fire(name: str, session_id: str, **fields: Any) -> dict[str, Any] | None:
    out = io.StringIO()
    assert run_hook(io.StringIO(json.dumps(event(name, session_id, **fields))), out) == 0
    return json.loads(out.getvalue()) if out.getvalue() else None


def _registered(answer: dict[str, Any] | None) -> tuple[str, str]:
    assert answer is not None
    found = REGISTERED.search(answer["hookSpecificOutput"]["additionalContext"])
    assert found
    return found[1], found[2]


@pytest.mark.parametrize("next_start", ["SessionStart", "none"])
def test_clear_keeps_the_hub_session_and_a_peer_s_pinned_send_still_arrives(
    inprocess_hub: str, register, monkeypatch: pytest.MonkeyPatch, next_start: str
) -> None:
    """SessionEnd(clear) then SessionStart(clear) under a new session id; `none`: the SessionStart
    after /clear never comes (as some Claude Code versions do), the next prompt carries it over."""
    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    alice = register("alice")
    name, ref = _registered(fire("SessionStart", SID_A, source="startup"))

    fire("UserPromptSubmit", SID_A, prompt="fix it")
    fire("Stop", SID_A, stop_hook_active=False, last_assistant_message="Fixed.")
    fire("SessionEnd", SID_A, reason="clear")
    if next_start == "SessionStart":
        assert _registered(fire("SessionStart", SID_B, source="clear")) == (name, ref)
        assert AgentSession.objects.get(ref=ref).status == "idle"  # at an empty prompt

    with HubClient(inprocess_hub, alice.token) as peer:
        sent = peer.send(to=f"{name} [{ref}]", message="Still there after the clear?")
    out = fire("UserPromptSubmit", SID_B, prompt="go on")

    assert (
        out is not None and "Still there after the clear?" in out["hookSpecificOutput"]["additionalContext"]
    )
    assert sent["status"] == "queued"
    assert AgentSession.objects.count() == 2  # no second session for the cleared conversation

    fire("SessionEnd", SID_B, reason="prompt_input_exit")  # a real exit ends it
    assert AgentSession.objects.get(name=name).status == "exited"


def test_resume_in_the_same_process_keeps_the_hub_session(inprocess_hub: str, monkeypatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    first = _registered(fire("SessionStart", SID_A, source="startup"))
    fire("SessionEnd", SID_A, reason="resume")
    assert _registered(fire("SessionStart", SID_B, source="resume")) == first
    assert AgentSession.objects.count() == 1


def test_resume_in_the_same_process_of_a_conversation_left_behind_keeps_one_session(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a running Claude Code (session A) and a conversation B whose Claude Code was killed
    (its saved session, tied to a process that is gone, not yet ended on the hub), when A's
    process resumes B (`/resume`), then it goes on as A's hub session, the one its MCP server
    (which keeps the id it started with) acts as, not as B's besides it: hooks and MCP server are
    one session, and B's is ended by the next registration on this machine."""
    from switchboard_agent.config import sessions_of_process
    from switchboard_agent.identity import Identity

    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    client_process(monkeypatch, this_process())
    first = _registered(fire("SessionStart", SID_A, source="startup"))
    client_process(monkeypatch, gone_process())
    fire("SessionStart", SID_B, source="startup")  # (its process has exited since)
    left = AgentSession.objects.exclude(ref=first[1]).get(name="shop")

    client_process(monkeypatch, this_process())
    fire("SessionEnd", SID_A, reason="resume")
    assert _registered(fire("SessionStart", SID_B, source="resume")) == first
    out = fire("UserPromptSubmit", SID_B, prompt="go on")  # the hooks act as A from here on
    assert out is None and AgentSession.objects.get(ref=first[1]).status == "busy"

    mcp = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)
    assert mcp.call(lambda c: c.me())["ref"] == first[1]
    assert len(sessions_of_process(this_process(), inprocess_hub)) == 1

    client_process(monkeypatch, "4242:1")  # another agent registers: B's session is ended
    monkeypatch.setenv("SWITCHBOARD_NAME", "api")
    fire("SessionStart", "0d9a7c2e-cccc-4b8a-9c3e-5a1b2c3d4e5f", source="startup", cwd="/work/api")
    left.refresh_from_db()
    assert left.status == "exited"
    assert [s.ref for s in holding("shop")] == [first[1]]


@pytest.fixture
def other_client() -> Any:
    """The anchor of another agent client process that runs (not this one, nor an ancestor)."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    anchor = client_anchor(other.pid)  # (a Python process: its own anchor)
    assert anchor.startswith(f"{other.pid}:")
    yield anchor
    other.kill()
    other.wait(timeout=30)


@pytest.fixture
def a_running(inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, other_client: str) -> tuple[str, str]:
    """Claude Code A (another client process, which runs) has registered session id A: its anchor
    and its hub session's ref. The hooks fired next run under this process (Claude Code B)."""
    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    client_process(monkeypatch, other_client)
    first = _registered(fire("SessionStart", SID_A, source="startup"))
    client_process(monkeypatch, this_process())
    return other_client, first[1]


def test_a_conversation_resumed_by_a_new_process_while_its_first_still_runs_is_two_sessions(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, a_running: tuple[str, str]
) -> None:
    """Given Claude Code A running session id A, when a second Claude Code B starts on the same
    conversation (`claude --resume A`) while A still runs, then B is a hub session of its own (its
    hooks and its MCP server alike) and A keeps its own, tied to A: neither takes the other's saved
    session, and B's quitting ends B's only."""
    from switchboard_agent.config import session_find
    from switchboard_agent.identity import Identity

    other_client, first = a_running
    second = _registered(fire("SessionStart", SID_A, source="resume"))
    assert second[1] != first
    mcp_b = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)
    assert mcp_b.call(lambda c: c.me())["ref"] == second[1]
    fire("UserPromptSubmit", SID_A, prompt="go on")  # B's hooks go on as B
    assert len(holding()) == 2

    client_process(monkeypatch, other_client)
    assert session_find(SID_A, inprocess_hub).anchor == other_client  # still A's
    fire("UserPromptSubmit", SID_A, prompt="and on")
    mcp_a = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)
    assert mcp_a.call(lambda c: c.me())["ref"] == first

    client_process(monkeypatch, this_process())
    fire("SessionEnd", SID_A, reason="prompt_input_exit")  # B quits
    assert [s.ref for s in holding()] == [first]
    assert AgentSession.objects.count() == 2


def test_a_conversation_resumed_by_a_new_process_goes_on_as_its_own_session_after_the_first_quits(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, a_running: tuple[str, str]
) -> None:
    """Given Claude Code A running session id A and Claude Code B on the same conversation
    (`claude --resume A` while A ran), when A quits first, then B's hooks and MCP server still act
    as B's own hub session, and B's quitting ends it: no hub session is left behind."""
    from switchboard_agent.identity import Identity

    other_client, first = a_running
    second = _registered(fire("SessionStart", SID_A, source="resume"))
    client_process(monkeypatch, other_client)
    fire("SessionEnd", SID_A, reason="prompt_input_exit")  # A quits
    assert AgentSession.objects.get(ref=first).status == "exited"
    assert [s.ref for s in holding()] == [second[1]]

    client_process(monkeypatch, this_process())
    mcp_b = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)
    assert mcp_b.call(lambda c: c.me())["ref"] == second[1]
    fire("SessionEnd", SID_A, reason="prompt_input_exit")  # B quits, its first hook since A's end

    assert holding() == [] and AgentSession.objects.count() == 2


def test_resume_in_a_process_of_a_conversation_open_in_another_keeps_each_process_its_session(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, a_running: tuple[str, str]
) -> None:
    """Given Claude Code A on session id A and Claude Code B on session id B, when B resumes A's
    conversation in place (`/resume`) while A runs, then B goes on as its own hub session (the one
    its MCP server acts as) and A as its own; when A quits, B still goes on as the same session."""
    from switchboard_agent.identity import Identity

    other_client, first = a_running
    second = _registered(fire("SessionStart", SID_B, source="startup"))

    fire("SessionEnd", SID_B, reason="resume")
    assert _registered(fire("SessionStart", SID_A, source="resume")) == second
    mcp_b = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_B)
    assert mcp_b.call(lambda c: c.me())["ref"] == second[1]
    client_process(monkeypatch, other_client)
    mcp_a = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)
    assert mcp_a.call(lambda c: c.me())["ref"] == first

    fire("SessionEnd", SID_A, reason="prompt_input_exit")  # A quits
    client_process(monkeypatch, this_process())
    fire("UserPromptSubmit", SID_A, prompt="go on")
    assert [s.ref for s in holding()] == [second[1]]
    assert AgentSession.objects.count() == 2  # none registered afresh
    assert mcp_b.call(lambda c: c.me())["ref"] == second[1]


def client_process(monkeypatch: pytest.MonkeyPatch, anchor: str) -> None:
    """The agent client process the next hooks and MCP servers run under (see conftest)."""
    from switchboard_agent import hooks, identity

    monkeypatch.setattr(identity, "client_anchor", lambda pid=None: anchor)
    monkeypatch.setattr(hooks, "client_anchor", identity.client_anchor)


def gone_process() -> str:
    """The anchor of a client process that has exited."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    return f"{dead.pid}:1"


def this_process() -> str:
    """The anchor of this test process, which stands for a client process that runs."""
    return THIS_PROCESS


def holding(name: str = "shop") -> list[AgentSession]:
    return list(AgentSession.objects.filter(name=name).exclude(status="exited"))


def test_an_agent_restarted_after_a_crash_does_not_leave_its_old_session_holding_the_name(
    inprocess_hub: str, register, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given Claude Code killed (no SessionEnd): its saved session, token included, is tied to a
    process that is gone; when Claude Code starts again in the same folder, then the old session is
    ended on the hub and its file removed before the new one registers: one live `shop`."""
    from switchboard_agent.config import session_load

    alice = register("alice")
    client_process(monkeypatch, gone_process())
    fire("SessionStart", SID_A, source="startup")
    old = AgentSession.objects.get(name="shop")

    client_process(monkeypatch, this_process())
    _registered(fire("SessionStart", SID_B, source="startup"))

    old.refresh_from_db()
    assert old.status == "exited" and session_load(SID_A) is None
    assert len(holding()) == 1
    with HubClient(inprocess_hub, alice.token) as peer:
        assert peer.send(to="shop", message="are you there?")["status"] == "queued"


def test_a_session_resumed_by_a_new_process_after_a_crash_is_its_own_and_stays(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`claude --resume` after a crash carries on the same session id in a new process: the saved
    session is tied to that process from then on, and another agent's registration leaves it be."""
    client_process(monkeypatch, gone_process())
    first = _registered(fire("SessionStart", SID_A, source="startup"))
    client_process(monkeypatch, this_process())
    assert _registered(fire("SessionStart", SID_A, source="resume")) == first

    client_process(monkeypatch, "4242:1")  # another agent, in another client process
    monkeypatch.setenv("SWITCHBOARD_NAME", "api")
    fire("SessionStart", SID_B, source="startup", cwd="/work/api")

    assert [s.ref for s in holding("shop")] == [first[1]] and len(holding("api")) == 1


def test_a_session_end_the_hub_missed_is_ended_by_the_next_registration(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a SessionEnd while the hub was down (the saved session is marked ended, the hub never
    heard), when any session registers next, then the hub hears the end and the file goes."""
    from switchboard_agent.config import Breaker, session_load
    from switchboard_agent.transport import ConnectError

    fire("SessionStart", SID_A, source="startup")
    working = HubClient.default_transport

    class Down:
        def handle(self, request: Any) -> Any:
            raise ConnectError("Connection refused")

        def close(self) -> None:
            pass

    monkeypatch.setattr(HubClient, "default_transport", Down())
    fire("SessionEnd", SID_A, reason="prompt_input_exit")
    assert session_load(SID_A).ended and len(holding()) == 1

    monkeypatch.setattr(HubClient, "default_transport", working)
    Breaker(inprocess_hub).reset()
    fire("SessionStart", SID_B, source="startup")

    assert len(holding()) == 1 and session_load(SID_A) is None


def test_left_behind_sessions_wait_while_the_hub_is_down_and_are_ended_a_few_at_a_time(
    inprocess_hub: str, register, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five sessions of crashed agents: a registration against a hub that is down ends none (and
    makes one request); with the hub back, each registration ends at most three."""
    from switchboard_agent.config import SavedSession, saved_sessions, session_save
    from switchboard_agent.registration import REAP_AT_ONCE
    from switchboard_agent.transport import ConnectError

    for n in range(5):
        crashed = register("shop")
        key = f"{SID_A[:-1]}{n}"
        session_save(SavedSession.registered(crashed.data, key=key, hub=inprocess_hub, anchor=gone_process()))
    client_process(monkeypatch, this_process())
    working, calls = HubClient.default_transport, []

    class Down:
        def handle(self, request: Any) -> Any:
            calls.append(request.url)
            raise ConnectError("Connection refused")

        def close(self) -> None:
            pass

    monkeypatch.setattr(HubClient, "default_transport", Down())
    fire("SessionStart", SID_B, source="startup")
    assert len(calls) == 1 and len(list(saved_sessions(inprocess_hub))) == 5

    monkeypatch.setattr(HubClient, "default_transport", working)
    from switchboard_agent.config import Breaker

    Breaker(inprocess_hub).reset()
    fire("SessionStart", SID_B, source="startup")
    assert len(holding()) == 5 - REAP_AT_ONCE + 1


def test_a_registration_a_crashed_agent_sent_without_hearing_the_answer_is_ended_by_the_next(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given an agent whose registration the hub committed, whose answer was lost, and which was
    then killed (only its pending record is left), when another agent registers, then the hub
    session that registration made is ended and the record removed."""
    from switchboard_agent.config import Breaker, pending_load
    from tests.agents.lossy import LosesRegistrationAnswer

    working = HubClient.default_transport
    monkeypatch.setattr(HubClient, "default_transport", LosesRegistrationAnswer(working))
    client_process(monkeypatch, gone_process())
    fire("SessionStart", SID_A, source="startup")
    assert pending_load(SID_A, inprocess_hub) is not None and len(holding()) == 1

    monkeypatch.setattr(HubClient, "default_transport", working)
    Breaker(inprocess_hub).reset()
    client_process(monkeypatch, this_process())
    fire("SessionStart", SID_B, source="startup")

    assert pending_load(SID_A, inprocess_hub) is None
    assert len(holding()) == 1 and AgentSession.objects.filter(status="exited").count() == 1


def test_an_mcp_server_whose_registration_answer_was_lost_gets_the_same_session_back(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP server registers the session its hooks will use (they had not yet); the hub
    commits, the answer is lost; its retry, and the hooks after it, act as that one session."""
    from switchboard_agent.identity import Identity
    from tests.agents.lossy import LosesRegistrationAnswer

    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    lossy = LosesRegistrationAnswer(HubClient.default_transport)
    monkeypatch.setattr(HubClient, "default_transport", lossy)
    identity = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)

    with pytest.raises(Exception, match="did not answer in time"):
        identity.call(lambda c: c.me())
    me = identity.call(lambda c: c.me())

    assert _registered(fire("SessionStart", SID_A, source="startup")) == (me["name"], me["ref"])
    assert len(holding()) == 1 and len(lossy.registrations) == 2


def test_the_mcp_server_follows_its_session_across_clear_by_the_first_session_id(
    inprocess_hub: str, monkeypatch
) -> None:
    """The MCP server keeps the CLAUDE_CODE_SESSION_ID it started with; after /clear the hooks
    serve a new id, and the server still finds the same hub session."""
    from switchboard_agent.identity import Identity

    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    fire("SessionStart", SID_A, source="startup")
    fire("SessionEnd", SID_A, reason="clear")
    fire("SessionStart", SID_B, source="clear")
    started = time.monotonic()
    identity = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)

    me = identity.call(lambda c: c.me())

    assert me["name"] == "shop" and AgentSession.objects.count() == 1
    assert time.monotonic() - started < 5


def test_an_mcp_server_whose_first_session_id_was_never_registered_uses_the_one_after_clear(
    inprocess_hub: str, monkeypatch
) -> None:
    """Given a Claude Code whose first session id was never registered (the hub away at its start,
    or skipped by the breaker) and /clear before any other hook: its hooks register the new id.
    When its MCP server (which keeps the first id) acts, then it acts as that session, the only
    one of its Claude Code process, not as a second one registered under the first id."""
    from switchboard_agent.identity import Identity

    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    fire("SessionEnd", SID_A, reason="clear")  # (SessionStart of SID_A never reached the hub)
    hooks = _registered(fire("SessionStart", SID_B, source="clear"))
    identity = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)

    me = identity.call(lambda c: c.me())

    assert (me["name"], me["ref"]) == hooks
    assert AgentSession.objects.count() == 1

    # The hub forgets it (reset, or an operator ended it): the server registers it again as the
    # hooks would, in the same saved session, and the hooks go on as the one it registered.
    from messaging.principals import HUB
    from messaging.services.sessions import session_deregister

    session_deregister(session=AgentSession.objects.get(), actor=HUB)
    again = identity.call(lambda c: c.me())
    fire("UserPromptSubmit", SID_B, prompt="go on")
    live = AgentSession.objects.exclude(status="exited")
    assert [s.ref for s in live] == [again["ref"]] and again["ref"] != me["ref"]
    identity.close()
    assert live.get().status == "busy"  # the hooks' session: SessionEnd ends it


def test_an_mcp_server_that_registers_first_registers_the_session_its_hooks_then_use(
    inprocess_hub: str, monkeypatch
) -> None:
    """The hub was down when the hooks ran: the MCP server (which knows the session id) registers
    it, under the hooks' lock and key, and the hooks carry on as that session."""
    from switchboard_agent.identity import Identity

    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_SESSION_ID", raising=False)
    identity = Identity(cwd="/work/shop", attach_to_hooks=True, client_key=SID_A)

    me = identity.call(lambda c: c.me())
    fire("PostToolUse", SID_A, tool_name="Read", tool_input={}, tool_use_id="toolu_1")

    assert _registered(fire("SessionStart", SID_A, source="resume")) == (me["name"], me["ref"])
    assert AgentSession.objects.count() == 1
    identity.close()
    assert AgentSession.objects.get().status == "busy"  # the hooks' session: SessionEnd ends it


# --- Which process is the agent client (identity.client_anchor) ---------------------------------
PRINT_ANCHOR = "from switchboard_agent.identity import client_anchor; print(client_anchor())"
FORKING_SHELL = """#!{python}
# A login shell that runs its command line as a child process, as nu, tcsh, xonsh and pwsh do.
import subprocess, sys
sys.exit(subprocess.run(sys.argv[-1], shell=True).returncode)
"""


def use_anchor(monkeypatch: pytest.MonkeyPatch, anchor: str) -> None:
    """The agent client process the next hook / MCP server runs under (see tests/agents/conftest)."""
    from switchboard_agent import hooks, identity

    monkeypatch.setattr(identity, "client_anchor", lambda pid=None: anchor)
    monkeypatch.setattr(hooks, "client_anchor", identity.client_anchor)


def live(name: str) -> list[AgentSession]:
    return list(AgentSession.objects.filter(name=name).exclude(status="exited"))


def fire_codex(name: str, **fields: Any) -> dict[str, Any] | None:
    out = io.StringIO()
    assert run_hook(io.StringIO(json.dumps(codex_event(name, **fields))), out, client_name="codex") == 0
    return json.loads(out.getvalue()) if out.getvalue() else None


def child_anchor(argv: list[str], env: dict[str, str]) -> str:
    """The anchor a child of this process (standing for the agent client) reports."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def one_codex_process(monkeypatch: pytest.MonkeyPatch, mcp_anchor: str, hook_anchors: list[str]) -> int:
    """Codex's MCP server starts, then its hooks run, each under the anchor it found; the number of
    live hub sessions while Codex runs."""
    from switchboard_agent.identity import Identity

    monkeypatch.setenv("SWITCHBOARD_NAME", "api")
    monkeypatch.delenv("SWITCHBOARD_TOKEN", raising=False)
    use_anchor(monkeypatch, mcp_anchor)
    server = Identity(cwd="/work/api", attach_to_hooks=True, owns_client_session=True, kind="codex")
    server.start()
    steps = [("SessionStart", {"source": "startup"}), ("UserPromptSubmit", {"prompt": "go on"})]
    for anchor, (step, fields) in zip(hook_anchors, steps[: len(hook_anchors)], strict=True):
        use_anchor(monkeypatch, anchor)
        fire_codex(step, **fields)
    sessions = len(live("api"))
    server.close()
    left = len(live("api"))
    assert not left, f"{sessions} live hub sessions for one Codex process, {left} left after it exited"
    return sessions


@pytest.mark.parametrize(
    "shell, login_shell",
    [
        ("nu", False),  # a forking shell the list knows (tcsh, pwsh, xonsh, elvish alike)
        ("quuxsh", True),  # one it does not know, but it is the user's $SHELL
        ("bash", False),  # the real bash, which execs the hook's command
    ],
)
def test_codex_hooks_through_the_login_shell_share_the_mcp_server_s_session(
    inprocess_hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shell: str, login_shell: bool
) -> None:
    """Codex runs each hook line through `$SHELL -lc`; its MCP server is its direct child. This test
    process stands for Codex."""
    if shell == "bash":
        path = Path("/bin/bash")
    else:
        path = tmp_path / shell
        path.write_text(FORKING_SHELL.format(python=sys.executable))
        path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SHELL"] = str(path) if login_shell else "/bin/sh"
    mcp_anchor = child_anchor([sys.executable, "-c", PRINT_ANCHOR], env)
    hook_line = f"{sys.executable} -c {json.dumps(PRINT_ANCHOR)}"
    hook_anchors = [child_anchor([str(path), "-lc", hook_line], env) for _ in range(2)]

    sessions = one_codex_process(monkeypatch, mcp_anchor, hook_anchors)

    assert mcp_anchor.startswith(f"{os.getpid()}:")
    assert hook_anchors == [mcp_anchor, mcp_anchor], f"{sessions} live hub sessions for one Codex process"
    assert sessions == 1


AGENT_AS_PID_1 = """
import json, os, subprocess, sys
if {init!r}:  # the agent runs under an init at PID 1; else it is PID 1
    os.execv({init!r}, [{init!r}, "-c", {again!r}])
argv = [sys.executable, "-c", {code!r}]
mcp = subprocess.run(argv, capture_output=True, text=True).stdout.strip()
hook = subprocess.run(["/bin/sh", "-c", " ".join(["exec", *map(repr, argv)])],
                      capture_output=True, text=True).stdout.strip()
print(json.dumps({{"mcp": mcp, "hook": hook}}))
"""


def anchors_in_a_pid_namespace(init: str = "") -> dict[str, str]:
    """Run an agent as PID 1 of a new PID namespace (`docker run -it image codex`, reproduced with
    `unshare --pid --fork --mount-proc`), or under `init` at PID 1 that runs the hooks and MCP
    server itself; the anchors its MCP server and a hook (through `sh -c exec`) report."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    script = AGENT_AS_PID_1.format(init="", code=PRINT_ANCHOR, again="")
    script = AGENT_AS_PID_1.format(init=init, code=PRINT_ANCHOR, again=script)
    argv = [unshare, "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        argv.insert(1, "--map-root-user")
    try:
        done = subprocess.run(
            [*argv, sys.executable, "-c", script],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot make a PID namespace here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_agent_running_as_a_container_s_pid_1_keeps_one_session(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    anchors = anchors_in_a_pid_namespace()

    sessions = one_codex_process(monkeypatch, anchors["mcp"], [anchors["hook"]])

    assert anchors["mcp"].startswith("1:") and anchors["hook"] == anchors["mcp"], anchors
    assert sessions == 1


def test_an_init_at_pid_1_is_no_agent_client(tmp_path: Path) -> None:
    """An init (here a Python named `tini`) at PID 1 that starts the MCP server and the hook
    itself: there is no agent client to tie them by."""
    init = tmp_path / "tini"
    init.symlink_to(sys.executable)

    anchors = anchors_in_a_pid_namespace(str(init))

    assert anchors == {"mcp": "", "hook": ""}


def test_a_codex_hook_that_finds_no_client_process_leaves_the_mcp_server_s_session_the_only_one(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No anchor (process facts unreadable): the MCP server keeps a session of its own; the hooks
    have no key it would also find, so they do nothing rather than register a second one."""
    sessions = one_codex_process(monkeypatch, "", ["", ""])

    assert sessions == 1
    log = (Path(os.environ["SWITCHBOARD_HOME"]) / "agent.log").read_text().splitlines()
    assert "cannot tell which Codex process runs this hook" in log[-1]


@pytest.mark.parametrize("client", ["gemini", "something-else"])
def test_an_mcp_server_of_a_client_started_from_claude_code_s_shell_is_not_that_claude_session(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """Claude Code passes CLAUDE_CODE_SESSION_ID to every command its Bash tool runs (2.1.332), so
    a Gemini CLI (or any client) started there hands it on to its own MCP server: that id names the
    Claude Code session, never this server's, which is tied to its own client process."""
    from switchboard_agent import identity as identity_module
    from switchboard_agent.config import SavedSession, session_save
    from switchboard_agent.identity import Identity

    claude_sid = "c1a0de00-1111-4b8a-9c3e-5a1b2c3d4e5f"
    session_save(
        SavedSession(
            key=claude_sid, hub=inprocess_hub, token="claude", id="c", name="shop", ref="rc", anchor="1:1"
        )
    )
    own = identity_module.client_anchor()  # this process stands for the Gemini CLI (see conftest)
    session_save(
        SavedSession(
            key="gemini-sid", hub=inprocess_hub, token="own", id="g", name="shop", ref="rg", anchor=own
        )
    )
    monkeypatch.setenv("CLAUDE_CODE_SESSION_ID", claude_sid)
    monkeypatch.setenv("SWITCHBOARD_ATTACH", "hooks")
    monkeypatch.setenv("SWITCHBOARD_CLIENT", client)

    identity = Identity.from_env(url=inprocess_hub, cwd="/work/shop")

    assert identity.client().token == "own"


def test_the_claude_code_mcp_server_still_finds_its_session_by_id(
    inprocess_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard_agent.config import SavedSession, session_save
    from switchboard_agent.identity import Identity

    session_save(
        SavedSession(key=SID_A, hub=inprocess_hub, token="a", id="a", name="shop", ref="ra", anchor="1:1")
    )
    monkeypatch.setenv("CLAUDE_CODE_SESSION_ID", SID_A)
    monkeypatch.setenv("SWITCHBOARD_ATTACH", "hooks")
    for client in ("claude", ""):  # "": a config written before install-hooks named the client
        monkeypatch.setenv("SWITCHBOARD_CLIENT", client)
        assert Identity.from_env(url=inprocess_hub, cwd="/work/shop").client().token == "a"
