"""Claude Code (the real CLI, `claude -p`) against a real hub, set up by `switchboard install-hooks`.

Everything runs in a network namespace with only loopback: the hub, a stand-in for the Anthropic
Messages API (`model_anthropic.py`, playing a scripted model) and Claude Code. The scripted model
loads the Switchboard MCP tool `send_message` (Claude Code offers MCP tools deferred, by name, so
a model calls ToolSearch first), sends "hello from the model" to `peer`, and once the tool answered
says "done". It holds the send until `peer` has sent the client's session a message, so the
PostToolUse hook after the send has that message to inject.

`claude -p` runs exactly as a user runs it after that one command, with no flag of ours: the
project's `.mcp.json` server and hooks need no approval in `-p` mode, and the Switchboard tools are
allowed by the rule `mcp__switchboard` that `install-hooks` wrote into `.claude/settings.json`
(without it the call is refused, "you haven't granted it yet"). Claude Code applies that shared
file's allow rules only in a folder its user has trusted, so the user's own setup here is the
project folder trusted, as Claude Code's trust dialog records it (Claude Code's gate, not ours).

Which hub session a conversation is, with the real CLI: an interactive `claude` on a
pseudo-terminal across `/clear`, `/resume` and `/exit`, and with a second `claude --resume` of its
conversation while it runs; `claude -p --resume` / `--continue` of a conversation whose first
process quit, or was killed. The rules are tests/agents/test_hook_identity.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hub_topology import wait_until
from tests.clients.harness import (
    HUB_PORT,
    HubInNetns,
    Netns,
    Terminal,
    assert_stop_hook_handed_over,
    clean_env,
    client_bin,
    from_peer,
    hook_calls,
    hooks_began_with,
    hub_in,
    hub_sessions,
    install_hooks,
    netns,
    strings,
)

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

MODEL_PORT = 8766
TOOL = "mcp__switchboard__send_message"
STAND_IN = Path(__file__).resolve().parent / "model_anthropic.py"
RUN_TIMEOUT = 60
API_KEY = "sk-ant-stand-in"
HOOK_TIMED = re.compile(
    r"Hooks: (\w+)\S* \[[^\]]*switchboard hook[^\]]*\] finished with status 0 \((\d+)ms\)"
)


def project_in(home: Path) -> Path:
    """The folder Claude Code works in, set up as docs/agents.md tells a user: one command; and
    trusted by its user, as Claude Code's trust dialog records it in `~/.claude.json` (in a folder
    never trusted, Claude Code 2.1.332 drops the project's allow rules: "workspace not yet
    trusted")."""
    project = home / "proj"
    project.mkdir()
    install_hooks(project, clean_env(home))
    trusted = {"projects": {str(project): {"hasTrustDialogAccepted": True}}}
    (home / ".claude.json").write_text(json.dumps(trusted))
    return project


def read_turn_in(space: Netns, home: Path) -> Path:
    """A project with hooks and a `notes.txt`, and a model that reads that file (ungated), then
    says "done": a turn that needs no hub. Returns the project."""
    project = project_in(home)
    (project / "notes.txt").write_text("nothing to see\n")
    _, gate = model_in(space, home, tool="Read", args={"file_path": str(project / "notes.txt")})
    gate.touch()
    return project


def model_in(
    space: Netns,
    home: Path,
    tool: str = TOOL,
    args: dict[str, Any] | None = None,
    finals: tuple[str, ...] = ("done",),
) -> tuple[Path, Path]:
    """Start the scripted model in `space` (it calls `tool` with `args`, none when "", then gives
    `finals`, one final answer each time the client asks on): the file it records requests to,
    and its gate file."""
    requests, gate = home / "model-requests.jsonl", home / "model-gate"
    args = args if args is not None else {"to": "peer", "message": "hello from the model"}
    proc = space.start(
        "model",
        [
            sys.executable,
            str(STAND_IN),
            str(MODEL_PORT),
            str(requests),
            str(gate),
            tool,
            json.dumps(args),
            *finals,
        ],
        clean_env(home),
        home / "model.log",
    )
    wait_until(lambda: "listening" in proc.log(), timeout=10, what="the model stand-in")
    return requests, gate


def stop_model(space: Netns) -> None:
    """Stop the scripted model `model_in` started in `space` (another can then take its port)."""
    [model] = [proc for proc in space.procs if proc.name == "model"]
    model.stop()
    space.procs.remove(model)


def claude_env(home: Path, **extra: str) -> dict[str, str]:
    """Claude Code's environment: its model the stand-in, its outside traffic turned off."""
    return clean_env(
        home,
        ANTHROPIC_BASE_URL=f"http://127.0.0.1:{MODEL_PORT}",
        ANTHROPIC_API_KEY=API_KEY,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        **extra,
    )


def claude(
    space: Netns, home: Path, project: Path, prompt: str, *extra: str, **env_extra: str
) -> subprocess.Popen[str]:
    """`claude -p` in `space`, its model the stand-in, its outside traffic turned off."""
    env = claude_env(home, **env_extra)
    argv = [client_bin("claude"), "-p", prompt, "--output-format", "json", *extra]
    return subprocess.Popen(
        space.argv(*argv), cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(run: subprocess.Popen[str]) -> tuple[dict[str, Any], float]:
    """Claude Code's JSON result once it exited, and how long it took from now."""
    started = time.monotonic()
    try:
        out, err = run.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        run.kill()
        out, err = run.communicate()
        raise AssertionError(f"claude -p did not finish in {RUN_TIMEOUT} s: {err[-2000:]}") from None
    assert run.returncode == 0, (out[-2000:], err[-2000:])
    return json.loads(out), time.monotonic() - started


def recorded(requests: Path) -> list[dict[str, Any]]:
    if not requests.exists():
        return []
    return [json.loads(line) for line in requests.read_text().splitlines() if line.strip()]


def conversation(requests: Path) -> list[dict[str, Any]]:
    """The request bodies of Claude Code's main loop (those offering tools), in order."""
    return [
        r["body"]
        for r in recorded(requests)
        if r["path"].startswith("/v1/messages") and r["body"].get("tools")
    ]


def offers(body: dict[str, Any], tool: str) -> bool:
    return any(t.get("name") == tool for t in body.get("tools") or [])


def answered(body: dict[str, Any], tool_use_id: str) -> bool:
    return any(
        block.get("type") == "tool_result" and block.get("tool_use_id") == tool_use_id
        for turn in body["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
    )


def mcp_server_env(home: Path) -> dict[str, str]:
    """The environment of the running `switchboard mcp` that Claude Code started for this test."""
    ours = f"SWITCHBOARD_HOME={home / '.switchboard'}".encode()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mcp" in cmdline and any(part.endswith(b"switchboard") for part in cmdline) and ours in environ:
            return dict(entry.decode().partition("=")[::2] for entry in environ if b"=" in entry)
    raise LookupError("no switchboard mcp process of this test")


def test_claude_code_sends_receives_and_reports_through_one_hub_session(tmp_path: Path) -> None:
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer")
        project = project_in(tmp_path)
        requests, gate = model_in(space, tmp_path)
        run = claude(space, tmp_path, project, "Say hello to the agent called peer.")

        # The model holds the send: by now SessionStart registered the session and
        # UserPromptSubmit ran; the peer's message can only come in by a later hook.
        wait_until(
            lambda: any(offers(body, TOOL) for body in conversation(requests)),
            timeout=RUN_TIMEOUT,
            what="the model asked to send",
        )
        mine = hub.agent_named(peer["token"], "proj")
        hub.send(peer, mine["ref"], "a note from peer")
        server_env = mcp_server_env(tmp_path)
        gate.touch()
        result, _ = finish(run)
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]

    assert result["result"] == "done" and not result["is_error"], result
    # Claude Code passed its session id to the MCP server, which acted as the hooks' session.
    assert server_env["CLAUDE_CODE_SESSION_ID"] == result["session_id"]
    assert server_env["SWITCHBOARD_ATTACH"] == "hooks"
    [session] = [s for s in hub_sessions(tmp_path) if s["kind"] == "claude-code"]
    assert session["ref"] == mine["ref"]

    assert [(m["text"], m["from"]["ref"]) for m in inbox] == [("hello from the model", mine["ref"])], inbox

    bodies = conversation(requests)
    everything = json.dumps(bodies[0])
    assert f"You are registered on the Switchboard hub as proj [{mine['ref']}]" in everything
    assert "a note from peer" not in everything
    # The PostToolUse hook after the send injected the peer's message, behind its marker.
    [last] = [b for b in bodies if answered(b, "toolu_stand_in_call")]
    note = from_peer(peer, "a note from peer")
    assert any(note.search(text) for text in strings(last)), json.dumps(last)[-3000:]

    # Idle with the final answer, then ended as Claude Code exited.
    assert (session["status"], session["final_answer"]) == ("exited", "done")
    calls = hook_calls(tmp_path)
    assert [event for event, _, _, _ in calls] == [
        "SessionStart",
        "UserPromptSubmit",
        "PostToolUse",  # after ToolSearch
        "PostToolUse",  # after send_message
        "Stop",
        "SessionEnd",
    ], calls
    assert all(level == "INFO" and outcome == "ok" for _, outcome, _, level in calls), calls


def test_claude_code_goes_on_with_a_message_its_stop_hook_found_then_ends(tmp_path: Path) -> None:
    """A message that arrives while the model writes its final answer is in no hook's pull but
    Stop's: the Stop hook blocks with it, Claude Code asks the model again with it, and the Stop
    after that answer (the message now delivered, nothing waiting) lets the turn end."""
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer")
        project = project_in(tmp_path)
        requests, gate = model_in(space, tmp_path, tool="", args={}, finals=("all done", "done, note read"))
        run = claude(space, tmp_path, project, "Tell me when you are done.")

        # The model holds its final answer: UserPromptSubmit has pulled (nothing), no tool runs.
        wait_until(lambda: conversation(requests), timeout=RUN_TIMEOUT, what="the model's first request")
        mine = hub.agent_named(peer["token"], "proj")
        hub.send(peer, mine["ref"], "a note from peer")
        gate.touch()
        result, _ = finish(run)

    assert (result["result"], result["is_error"]) == ("done, note read", False), result
    # The prompt, then the Stop hook's reason; SessionEnd as Claude Code exited.
    bodies = conversation(requests)
    assert_stop_hook_handed_over(tmp_path, bodies, peer, "a note from peer", "all done", then=("SessionEnd",))
    [session] = [s for s in hub_sessions(tmp_path) if s["kind"] == "claude-code"]
    assert session["ref"] == mine["ref"]
    # The second Stop reported the session idle with the answer after the message, then it ended.
    assert (session["status"], session["final_answer"]) == ("exited", "done, note read"), session


# A hub that takes connections and never answers: the kernel completes each handshake into the
# listen backlog, nothing ever accepts or reads.
HUNG_HUB = (
    "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(64); time.sleep(600)"
)


@pytest.mark.parametrize("hub_state", ["down", "hung"])
def test_claude_code_finishes_its_turn_promptly_without_a_hub(tmp_path: Path, hub_state: str) -> None:
    (tmp_path / ".switchboard").mkdir(mode=0o700)
    (tmp_path / ".switchboard" / "enroll.key").write_text("sbe_left-by-a-hub-that-is-gone\n")
    with netns() as space:
        if hub_state == "hung":
            space.start(
                "hung hub",
                [sys.executable, "-c", HUNG_HUB.format(port=HUB_PORT)],
                clean_env(tmp_path),
                tmp_path / "hung.log",
            )
        project = read_turn_in(space, tmp_path)
        started = time.monotonic()
        result, _ = finish(
            claude(
                space,
                tmp_path,
                project,
                "Read notes.txt.",
                "--debug-file",
                str(tmp_path / "claude-debug.log"),
            )
        )
        took = time.monotonic() - started

    assert result["result"] == "done" and not result["is_error"], result
    # As Claude Code timed each hook (its debug log), and as each hook logged itself.
    timed = HOOK_TIMED.findall((tmp_path / "claude-debug.log").read_text())
    calls = hook_calls(tmp_path)
    print(f"\nhub {hub_state}: claude -p took {took:.1f} s; hooks:", *timed, *calls, sep="\n  ")
    assert [event for event, _ in timed] == ["SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"], timed
    assert all(int(ms) < 3300 for _, ms in timed), timed
    assert [event for event, _, _, _ in calls] == [
        "SessionStart",
        "UserPromptSubmit",
        "PostToolUse",
        "Stop",
        "SessionEnd",
    ], calls
    assert all(ms < 3000 for _, _, ms, _ in calls), calls


def test_claude_code_started_without_permission_prompts_registers_as_bypass(tmp_path: Path) -> None:
    """Its SessionStart says nothing of the mode, yet the hub must know it: it holds messages from
    peers that ask for permission to a session that never asks."""
    with netns() as space:
        hub_in(space, tmp_path)
        project = read_turn_in(space, tmp_path)
        # IS_SANDBOX: Claude Code's own switch that lets root (the namespace needs root) skip prompts.
        result, _ = finish(
            claude(
                space,
                tmp_path,
                project,
                "Read notes.txt.",
                "--permission-mode",
                "bypassPermissions",
                IS_SANDBOX="1",
            )
        )

    assert result["result"] == "done", result
    [session] = [s for s in hub_sessions(tmp_path) if s["kind"] == "claude-code"]
    assert session["permission_mode"] == "bypass"


# Enter as Claude Code 2.1.332 reads it on this pseudo-terminal (which answers none of its probes
# for the terminal's kind): the kitty keyboard protocol's Enter (CSI 13 u). A bare carriage return
# submits nothing there (the next key typed shows on a new line of the prompt).
ENTER = b"\x1b[13u"


def interactive_project_in(home: Path) -> Path:
    """`project_in`, and what a user's first interactive start there records: Claude Code's
    onboarding done and the API key approved (`~/.claude.json`), and the project's MCP server
    approved, as its dialog's "Use this MCP server" records it (`.claude/settings.local.json`,
    `enabledMcpjsonServers`)."""
    project = project_in(home)
    user = json.loads((home / ".claude.json").read_text())
    user |= {"hasCompletedOnboarding": True, "customApiKeyResponses": {"approved": [API_KEY[-20:]]}}
    (home / ".claude.json").write_text(json.dumps(user))
    (project / ".claude" / "settings.local.json").write_text(
        json.dumps({"enabledMcpjsonServers": ["switchboard"]})
    )
    return project


def claude_sessions(home: Path) -> list[dict[str, Any]]:
    """Every Claude Code session the hub under `home` ever registered."""
    return [s for s in hub_sessions(home) if s["kind"] == "claude-code"]


# The hooks of an interactive Claude Code's start and first turn (one that calls no tool).
FIRST_TURN: tuple[str, ...] = ("SessionStart", "UserPromptSubmit", "Stop")


def claude_after_a_turn(space: Netns, home: Path) -> tuple[HubInNetns, dict[str, Any], Path, Path, Terminal]:
    """The hub in `space`, a peer, and an interactive Claude Code in its project once it has had a
    turn that calls no tool: the hub, the peer, the project, the model's request log and the
    terminal (for the caller to close)."""
    hub = hub_in(space, home)
    peer = hub.register("peer")
    project = interactive_project_in(home)
    requests, gate = model_in(space, home, tool="", args={})
    gate.touch()
    terminal = Terminal(space, [client_bin("claude")], claude_env(home), project, enter=ENTER)
    try:
        terminal.until(hooks_began_with(home, "SessionStart"), "SessionStart")
        terminal.type("Tell me when you are done.")
        terminal.until(hooks_began_with(home, *FIRST_TURN), "the first turn's end")
    except BaseException:
        terminal.close()
        raise
    return hub, peer, project, requests, terminal


def test_an_interactive_claude_code_keeps_its_hub_session_across_clear_and_resume_and_ends_it_on_exit(
    tmp_path: Path,
) -> None:
    """`/clear` starts a new Claude Code session id in the same process: the hooks carry the hub
    session over (idle at the empty prompt), so a message a peer pinned to its ref before the clear
    reaches it after, and the MCP server (which keeps the id it started with, and first acts after
    the clear) sends as that session. `/resume` of the first conversation, in the same process,
    keeps it too (idle again). `/exit` ends it. The rules of tests/agents/test_hook_identity.py's
    test_clear_keeps_the_hub_session_and_a_peer_s_pinned_send_still_arrives,
    test_the_mcp_server_follows_its_session_across_clear_by_the_first_session_id and
    test_resume_in_the_same_process_keeps_the_hub_session."""
    with netns() as space:
        hub, peer, _, requests, terminal = claude_after_a_turn(space, tmp_path)
        steps = FIRST_TURN
        try:
            [before] = claude_sessions(tmp_path)
            [first_conversation] = (tmp_path / ".claude" / "projects").glob("*/*.jsonl")
            hub.send(peer, before["ref"], "a note from peer")
            stop_model(space)
            model_in(space, tmp_path)  # this one sends
            asked_before_clear = len(conversation(requests))
            terminal.type("/clear")
            steps += ("SessionEnd", "SessionStart")
            terminal.until(hooks_began_with(tmp_path, *steps), "/clear")
            [cleared] = claude_sessions(tmp_path)  # its SessionStart hook has answered
            terminal.type("Say hello to the agent called peer.")
            steps += ("UserPromptSubmit", "PostToolUse", "PostToolUse", "Stop")  # ToolSearch, the send
            terminal.until(hooks_began_with(tmp_path, *steps), "the turn after /clear")
            terminal.type(f"/resume {first_conversation.stem}")
            steps += ("SessionEnd", "SessionStart")
            terminal.until(hooks_began_with(tmp_path, *steps), "/resume")
            [resumed] = claude_sessions(tmp_path)
            terminal.type("/exit")
            steps += ("SessionEnd",)
            terminal.until(hooks_began_with(tmp_path, *steps), "SessionEnd after /exit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                terminal.proc.wait(timeout=10)
        finally:
            terminal.close()
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]

    # At the empty prompt after /clear, and after /resume, the hub shows the session idle.
    assert (before["status"], cleared["status"], resumed["status"]) == ("idle", "idle", "idle"), (
        before,
        cleared,
        resumed,
    )
    # One hub session, the same before and after /clear and /resume, ended by /exit.
    [session] = claude_sessions(tmp_path)
    assert (session["ref"], session["status"]) == (before["ref"], "exited"), session
    assert [(m["text"], m["from"]["ref"]) for m in inbox] == [("hello from the model", before["ref"])], inbox
    # The conversation after /clear: SessionStart told the model the same name and ref, and
    # UserPromptSubmit handed it the message pinned to that ref before the clear.
    after = "\n".join(strings(conversation(requests)[asked_before_clear]))
    assert f"You are registered on the Switchboard hub as proj [{before['ref']}]" in after, after[-3000:]
    assert from_peer(peer, "a note from peer").search(after), after[-3000:]
    calls = hook_calls(tmp_path)
    assert [event for event, _, _, _ in calls] == list(steps), calls
    assert all(level == "INFO" and outcome == "ok" for _, outcome, _, level in calls), calls


def assert_went_on_as(
    home: Path, told: dict[str, Any], inbox: list[dict[str, Any]], ref: str, events: list[str]
) -> None:
    """The conversation resumed under `home` went on as hub session `ref`: its SessionStart told
    the model so (`told`, the model's first request after it), its MCP server sent the model's
    message as it (`inbox`, the peer's), and the hooks of both runs ran `events`, none failing."""
    text = "\n".join(strings(told))
    assert f"You are registered on the Switchboard hub as proj [{ref}]" in text, text[-3000:]
    assert [(m["text"], m["from"]["ref"]) for m in inbox] == [("hello from the model", ref)], inbox
    calls = hook_calls(home)
    assert [event for event, _, _, _ in calls] == events, calls
    assert all(level == "INFO" and outcome == "ok" for _, outcome, _, level in calls), calls


def test_a_conversation_resumed_by_a_new_claude_code_after_the_first_quit_is_a_new_hub_session(
    tmp_path: Path,
) -> None:
    """Quitting ends the hub session (docs/agents.md: `exited`, its token void), and the saved
    session with it: `claude -p --resume <id>` afterwards, in a new process, registers the
    conversation afresh, and its MCP server sends as that new session, not as the old one nor as
    a third."""
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer")
        project = project_in(tmp_path)
        _, gate = model_in(space, tmp_path, tool="", args={})
        gate.touch()
        first, _ = finish(claude(space, tmp_path, project, "Tell me when you are done."))
        [ended] = claude_sessions(tmp_path)
        assert ended["status"] == "exited", ended

        stop_model(space)
        requests, _ = model_in(space, tmp_path)
        asked_before = len(conversation(requests))
        resumed, _ = finish(
            claude(
                space,
                tmp_path,
                project,
                "Say hello to the agent called peer.",
                "--resume",
                first["session_id"],
            )
        )
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]

    assert resumed["result"] == "done" and resumed["session_id"] == first["session_id"], resumed
    old, new = claude_sessions(tmp_path)
    assert old["ref"] == ended["ref"] and new["ref"] != ended["ref"], (old, new)
    assert (old["status"], new["status"]) == ("exited", "exited")
    assert_went_on_as(
        tmp_path,
        conversation(requests)[asked_before],
        inbox,
        new["ref"],
        [
            *("SessionStart", "UserPromptSubmit", "Stop", "SessionEnd"),
            *("SessionStart", "UserPromptSubmit", "PostToolUse", "PostToolUse", "Stop", "SessionEnd"),
        ],
    )


def test_a_conversation_resumed_by_a_new_claude_code_after_a_crash_keeps_its_hub_session(
    tmp_path: Path,
) -> None:
    """A Claude Code killed mid-turn (no SessionEnd) leaves its hub session, tied to a process
    that is gone; `claude -p --continue` in a new process goes on as that same session (its
    hooks and its MCP server alike), ties it to itself, and ends it on quitting. The rule of
    tests/agents/test_hook_identity.py's
    test_a_session_resumed_by_a_new_process_after_a_crash_is_its_own_and_stays."""
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer")
        project = project_in(tmp_path)
        requests, gate = model_in(space, tmp_path, tool="", args={})  # holds its answer
        crashed = claude(space, tmp_path, project, "Say hello to the agent called peer.")
        wait_until(lambda: conversation(requests), timeout=RUN_TIMEOUT, what="the model's first request")
        mine = hub.agent_named(peer["token"], "proj")
        crashed.kill()
        crashed.communicate(timeout=RUN_TIMEOUT)
        [transcript] = (tmp_path / ".claude" / "projects").glob("*/*.jsonl")  # Claude Code's record of it

        stop_model(space)
        model_in(space, tmp_path)  # this one sends
        gate.touch()
        asked_before = len(conversation(requests))
        resumed, _ = finish(claude(space, tmp_path, project, "Go on.", "--continue"))
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]

    assert resumed["result"] == "done" and resumed["session_id"] == transcript.stem, resumed
    [session] = claude_sessions(tmp_path)
    assert (session["ref"], session["status"]) == (mine["ref"], "exited"), session
    assert_went_on_as(
        tmp_path,
        conversation(requests)[asked_before],
        inbox,
        mine["ref"],
        [
            *("SessionStart", "UserPromptSubmit"),  # then killed
            *("SessionStart", "UserPromptSubmit", "PostToolUse", "PostToolUse", "Stop", "SessionEnd"),
        ],
    )


def test_a_conversation_resumed_by_a_new_claude_code_while_the_first_runs_is_a_session_of_its_own(
    tmp_path: Path,
) -> None:
    """`claude --resume <id>` in a second terminal while the Claude Code that runs conversation
    `id` is still up: two agents, each a hub session of its own, hooks and MCP server alike;
    neither takes, re-ties or ends the other's, whichever quits first. The rule of
    tests/agents/test_hook_identity.py's
    test_a_conversation_resumed_by_a_new_process_while_its_first_still_runs_is_two_sessions."""
    turn = ("UserPromptSubmit", "PostToolUse", "PostToolUse", "Stop")  # ToolSearch, then the send
    with netns() as space:
        hub, peer, project, requests, first = claude_after_a_turn(space, tmp_path)
        steps, second = FIRST_TURN, None
        try:
            [transcript] = (tmp_path / ".claude" / "projects").glob("*/*.jsonl")  # Claude Code's record
            stop_model(space)
            model_in(space, tmp_path)  # this one sends

            argv = [client_bin("claude"), "--resume", transcript.stem]
            second = Terminal(space, argv, claude_env(tmp_path), project, enter=ENTER)
            steps += ("SessionStart",)
            second.until(hooks_began_with(tmp_path, *steps), "the second one's SessionStart")
            asked = len(conversation(requests))
            second.type("Say hello to the agent called peer.")
            steps += turn
            second.until(hooks_began_with(tmp_path, *steps), "the second one's turn")
            told = "\n".join(strings(conversation(requests)[asked]))
            first.type("Say hello to the agent called peer.")
            steps += turn
            first.until(hooks_began_with(tmp_path, *steps), "the first one's second turn")
            first.type("/exit")  # the first quits, then the second
            steps += ("SessionEnd",)
            first.until(hooks_began_with(tmp_path, *steps), "the first one's SessionEnd")
            second.type("/exit")
            steps += ("SessionEnd",)
            second.until(hooks_began_with(tmp_path, *steps), "the second one's SessionEnd")
        finally:
            first.close()
            if second is not None:
                second.close()
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]

    # Two hub sessions, one per process, each ended by its own process's SessionEnd.
    one, other = claude_sessions(tmp_path)
    assert one["ref"] != other["ref"], (one, other)
    assert (one["status"], other["status"]) == ("exited", "exited"), (one, other)
    # The second's hooks told its model its own session; each MCP server sent as its own.
    assert f"You are registered on the Switchboard hub as proj [{other['ref']}]" in told, told[-3000:]
    assert [m["from"]["ref"] for m in inbox] == [other["ref"], one["ref"]], inbox
    calls = hook_calls(tmp_path)
    assert [event for event, _, _, _ in calls] == list(steps), calls
    assert all(level == "INFO" and outcome == "ok" for _, outcome, _, level in calls), calls


# Esc as Claude Code 2.1.332 reads it on this pseudo-terminal: the kitty keyboard protocol's Escape
# (CSI 27 u), as its Enter is CSI 13 u.
ESCAPE = b"\x1b[27u"
# How long Claude Code's prompt waits for its user before its `idle_prompt` notification, here
# (`messageIdleNotifThresholdMs` in `~/.claude.json`; 60000 by default).
IDLE_NOTICE_MS = 2000
# Events that could tell a hook a turn has ended, each recorded (its JSON input, one line) by a
# hook of the test's own.
TURN_END_EVENTS = ("Stop", "StopFailure", "PostToolUseFailure", "Notification")


def test_an_interactive_claude_code_interrupted_mid_turn_runs_no_hook_so_it_shows_busy(
    tmp_path: Path,
) -> None:
    """Esc ends a turn with no hook at all: no Stop, StopFailure or PostToolUseFailure, and no
    `idle_prompt` Notification either (Claude Code 2.1.332 sends that only after a turn that
    completed, once its prompt has waited `messageIdleNotifThresholdMs`): the hub shows the session
    busy until its next turn ends. docs/agents.md says so. Then a turn that completes: Stop reports
    idle, and the `idle_prompt` Notification follows (the threshold here is in force). The first
    model never answers (its gate stays shut), so the first turn ends only by the interrupt."""
    recorded_events = tmp_path / "turn-end-events.jsonl"
    with netns() as space:
        hub_in(space, tmp_path)
        project = interactive_project_in(tmp_path)
        user = json.loads((tmp_path / ".claude.json").read_text())
        (tmp_path / ".claude.json").write_text(
            json.dumps(user | {"messageIdleNotifThresholdMs": IDLE_NOTICE_MS})
        )
        local = project / ".claude" / "settings.local.json"
        record = {"type": "command", "command": f"{{ cat; echo; }} >> {recorded_events}"}
        hooks = {event: [{"matcher": "*", "hooks": [record]}] for event in TURN_END_EVENTS}
        local.write_text(json.dumps(json.loads(local.read_text()) | {"hooks": hooks}))
        requests, _ = model_in(space, tmp_path, tool="", args={})  # holds its answer: no gate
        debug = tmp_path / "claude-debug.log"
        argv = [client_bin("claude"), "--debug-file", str(debug)]
        terminal = Terminal(space, argv, claude_env(tmp_path), project, enter=ENTER)
        try:
            terminal.until(hooks_began_with(tmp_path, "SessionStart"), "SessionStart")
            terminal.type("Tell me when you are done.")
            terminal.until(lambda: conversation(requests), "the model's first request")
            terminal.until(hooks_began_with(tmp_path, "SessionStart", "UserPromptSubmit"), "the turn's start")
            os.write(terminal.master, ESCAPE)
            terminal.until(lambda: "Request was aborted" in debug.read_text(), "the interrupt")
            time.sleep(IDLE_NOTICE_MS / 1000 + 5)  # the threshold, and time for any hook to run
            [interrupted] = claude_sessions(tmp_path)
            after_interrupt = recorded_events.read_text() if recorded_events.exists() else ""

            stop_model(space)
            _, gate = model_in(space, tmp_path, tool="", args={})
            gate.touch()
            terminal.type("Tell me when you are done.")
            terminal.until(
                lambda: recorded_events.exists() and "idle_prompt" in recorded_events.read_text(),
                "idle_prompt after a turn",
            )
        finally:
            terminal.close()

    assert (interrupted["status"], after_interrupt) == ("busy", ""), (interrupted, after_interrupt)
    [stop, notice] = [json.loads(line) for line in recorded_events.read_text().splitlines() if line.strip()]
    assert (stop["hook_event_name"], notice["hook_event_name"]) == ("Stop", "Notification"), (stop, notice)
    assert notice["notification_type"] == "idle_prompt" and notice["session_id"] == stop["session_id"], notice
    [session] = claude_sessions(tmp_path)
    assert (session["ref"], session["status"]) == (interrupted["ref"], "idle"), session
    calls = hook_calls(tmp_path)
    assert [event for event, _, _, _ in calls] == [
        "SessionStart",
        "UserPromptSubmit",
        "UserPromptSubmit",
        "Stop",
    ], calls
