"""Codex CLI (the real `codex exec`, pinned in tests/clients/package.json) against a real hub.

Everything runs in a network namespace with only loopback (tests/clients/harness.py): the hub, the
stand-in for the Responses API (tests/clients/model_responses.py) and Codex. The user's steps are
the ones docs/agents.md gives: `switchboard install-hooks --client codex --write` (which also
approves the Switchboard tools: `codex exec` fails a tool call that needs approval), then trusting
the five hooks as Codex's `/hooks` does (`codex app-server`: `hooks/list`, then
`config/batchWrite` of `[hooks.state]` with each hook's `currentHash`), Codex's own gate.
`codex exec resume --last` takes the conversation up again in a new process. A turn interrupted
with Esc needs the interactive TUI (`Terminal`): `codex exec` has no key to press.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hub_topology import VENV_BIN, Proc, wait_until
from tests.clients.harness import (
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
    netns,
    strings,
)

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

MODEL_PORT = 8766
MODEL_SCRIPT = Path(__file__).resolve().parent / "model_responses.py"
CODEX_TIMEOUT = 60
HOOK_DEADLINE_MS = 3000

# The user's own Codex config: the stand-in as the model provider; no update check, analytics or
# plugin sync (each would try the network, which the namespace does not have).
USER_CONFIG = f"""\
model = "stand-in-model"
model_provider = "stand-in"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
in_app_updates = false

[model_providers.stand-in]
name = "stand-in"
base_url = "http://127.0.0.1:{MODEL_PORT}/v1"
wire_api = "responses"
"""

# What Codex's /hooks does, through the app server Codex's TUI talks to: list the hooks, record each
# one's current hash as trusted in the user's config.toml ([hooks.state]).
_TRUST = """
import json, subprocess, sys
codex, project = sys.argv[1], sys.argv[2]
server = subprocess.Popen([codex, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
last = 0
def call(method, params):
    global last
    last += 1
    server.stdin.write(json.dumps({"id": last, "method": method, "params": params}) + "\\n")
    server.stdin.flush()
    while True:
        message = json.loads(server.stdout.readline())
        if message.get("id") == last:
            if "error" in message:
                raise SystemExit(f"{method}: {message['error']}")
            return message["result"]
def write(key_path, value):
    call("config/batchWrite", {"edits": [{"keyPath": key_path, "mergeStrategy": "upsert", "value": value}]})
call("initialize", {"clientInfo": {"name": "switchboard-tests", "version": "0"}})
server.stdin.write(json.dumps({"method": "initialized"}) + "\\n")
hooks = [h for entry in call("hooks/list", {"cwds": [project]})["data"] for h in entry["hooks"]]
write("hooks.state", {h["key"]: {"trusted_hash": h["currentHash"]} for h in hooks})
hooks = [h for entry in call("hooks/list", {"cwds": [project]})["data"] for h in entry["hooks"]]
print(json.dumps([{"event": h["eventName"], "trust": h["trustStatus"]} for h in hooks]))
server.stdin.close()
server.wait(timeout=10)
"""


class CodexSetup:
    """A user's machine in the namespace: HOME with Codex's config, a project with the
    Switchboard hooks installed and trusted, the model stand-in listening."""

    def __init__(self, space: Netns, home: Path) -> None:
        self.space = space
        self.home = home
        self.codex = client_bin("codex")
        self.project = home / "proj"
        self.project.mkdir()
        self.env = clean_env(home, CODEX_HOME=str(home / ".codex"), SHELL="/bin/bash", SB_DUMP_TMP="1")
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").write_text(USER_CONFIG)
        self.requests_log = home / "model-requests.jsonl"
        self.release = home / "model-release"

    def install_hooks(self) -> str:
        argv = [
            str(VENV_BIN / "switchboard"),
            "install-hooks",
            "--client",
            "codex",
            "--scope",
            "user",
            "--write",
        ]
        out = self.run(argv)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def record(self, path: Path, events: tuple[str, ...]) -> None:
        """A hook of the test's own for each of `events`, besides Switchboard's: it appends its
        JSON input, one line, to `path` (trusted with the rest by `trust`)."""
        entry = f'type = "command"\ncommand = "{{ cat; echo; }} >> {path}"\ntimeout = 10\n'
        tables = "".join(f"\n[[hooks.{event}]]\n[[hooks.{event}.hooks]]\n{entry}" for event in events)
        config = self.home / ".codex" / "config.toml"
        config.write_text(config.read_text() + tables)

    def trust_project(self) -> None:
        """The project trusted, as the interactive Codex's trust prompt records it."""
        config = self.home / ".codex" / "config.toml"
        trusted = f'\n[projects."{self.project}"]\ntrust_level = "trusted"\n'
        config.write_text(config.read_text() + trusted)

    def trust(self) -> list[dict[str, str]]:
        out = self.run([sys.executable, "-c", _TRUST, str(self.codex), str(self.project)])
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def start_model(self, *script: str) -> None:
        """The stand-in, with `script`'s options (model_responses.py: `--no-tool`, `--final`)."""
        argv = [sys.executable, str(MODEL_SCRIPT), "--port", str(MODEL_PORT)]
        argv += ["--log", str(self.requests_log), "--release", str(self.release), *script]
        # Up well before Codex's first request (Codex retries a refused connection anyway).
        self.space.start("model", argv, self.env, self.home / "model.log")

    def start_codex(self, prompt: str, *, resume: bool = False) -> Proc:
        """`codex exec` (`resume`: `codex exec resume --last`, the newest conversation) in the
        project, as its user would start it (`env -C` execs Codex there)."""
        argv = [
            "env",
            "-C",
            str(self.project),
            str(self.codex),
            "exec",
            *(["resume", "--last"] if resume else []),
        ]
        argv += ["--skip-git-repo-check", "--json", prompt]
        log = self.home / ("codex-resumed.log" if resume else "codex.log")
        return self.space.start("codex", argv, self.env, log)

    def run(self, argv: list[str], timeout: float = 60) -> Any:
        return self.space.run(argv, env=self.env, cwd=self.project, timeout=timeout)

    def requests(self) -> list[dict[str, Any]]:
        if not self.requests_log.exists():
            return []
        return [json.loads(line) for line in self.requests_log.read_text().splitlines() if line.strip()]

    def conversation(self) -> list[dict[str, Any]]:
        """The bodies of the requests that offered the model the Switchboard tools (Codex's turn)."""
        return [
            r["body"]
            for r in self.requests()
            if r["path"].endswith("/responses") and "mcp__switchboard" in json.dumps(r["body"].get("tools"))
        ]

    def agent_log(self) -> list[str]:
        path = self.home / ".switchboard" / "agent.log"
        return path.read_text().splitlines() if path.exists() else []


def codex_user(
    space: Netns, home: Path, *, record: tuple[Path, tuple[str, ...]] | None = None
) -> tuple[HubInNetns, dict[str, Any], CodexSetup]:
    """The hub, a peer (in `bypass`: `codex exec` runs without asking, so what a `default` peer
    sends it is held for a person) and a user's Codex with the hooks installed and trusted
    (`record`: and the test's own recording hooks, `CodexSetup.record`)."""
    hub = hub_in(space, home)
    peer = hub.register("peer", permission_mode="bypass")
    setup = CodexSetup(space, home)
    setup.install_hooks()
    if record is not None:
        setup.record(*record)
    setup.trust()
    return hub, peer, setup


def sessions_named(hub: HubInNetns, token: str, name: str) -> list[dict[str, Any]]:
    answer = hub.call("GET", f"agents?include_exited=true&name={name}", token)
    assert answer["status"] == 200, answer
    return [a for a in answer["body"]["agents"] if a["name"] == name]


def row_of(home: Path, session: dict[str, Any]) -> dict[str, Any]:
    """The hub's row for `session` (as the agents list shows it)."""
    [row] = [r for r in hub_sessions(home) if r["ref"] == session["ref"]]
    return row


def events(log: str) -> list[dict[str, Any]]:
    """The JSON events `codex exec --json` printed among the lines of its output `log`."""
    lines = [line for line in log.splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines]


def session_in_bypass(hub: HubInNetns, home: Path, token: str) -> list[dict[str, Any]]:
    """Codex's session (`proj`) once the hub has it in `bypass`, else []: the MCP server registers
    it as `default` (it cannot tell the mode), the SessionStart hook reports `bypass`."""
    found = sessions_named(hub, token, "proj")
    return found if found and row_of(home, found[0])["permission_mode"] == "bypass" else []


def test_codex_exec_registers_messages_and_ends_through_hooks_and_mcp(tmp_path: Path) -> None:
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer", permission_mode="bypass")  # codex exec runs without asking
        setup = CodexSetup(space, tmp_path)
        setup.install_hooks()
        trusted = setup.trust()
        assert sorted(h["event"] for h in trusted) == [
            "interrupt",
            "postToolUse",
            "sessionStart",
            "stop",
            "userPromptSubmit",
        ]
        assert {h["trust"] for h in trusted} == {"trusted"}
        setup.start_model()
        codex = setup.start_codex("Say hello to peer on Switchboard.")

        # The model holds its first answer (the send): SessionStart and UserPromptSubmit have run,
        # so the peer's message can only come in by the PostToolUse hook after the send.
        wait_until(setup.conversation, timeout=CODEX_TIMEOUT, what="the model's first request")
        assert [event for event, _, _, _ in hook_calls(tmp_path)] == ["SessionStart", "UserPromptSubmit"]
        [mine] = session_in_bypass(hub, tmp_path, peer["token"])
        hub.send(peer, mine["ref"], "ping from peer")
        setup.release.touch()
        assert codex.popen.wait(timeout=CODEX_TIMEOUT) == 0, codex.log()[-3000:]

        # One hub session for the run: hooks and MCP server shared it, and it ended with Codex.
        [session] = sessions_named(hub, peer["token"], "proj")
        assert (session["kind"], session["status"]) == ("codex", "exited"), session
        row = row_of(tmp_path, session)
        assert row["final_answer"] == "done"
        # Registered by the MCP server, which cannot tell the mode; the first hook said bypass.
        assert row["permission_mode"] == "bypass"
        # The model's tool call reached the peer from that session.
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]
        assert [(m["text"], m["from"]["ref"]) for m in inbox] == [("hello from the model", session["ref"])], (
            inbox
        )
        # The PostToolUse hook after the send injected the peer's message, behind the hub's marker:
        # the request with the send's result has it, the one before it did not.
        first, after_send = ["\n".join(strings(body)) for body in setup.conversation()]
        note = from_peer(peer, "ping from peer")
        assert f"registered on the Switchboard hub as proj [{session['ref']}]" in first
        assert not note.search(first) and note.search(after_send), after_send[-3000:]
        # Every hook ran once, in order, and none failed.
        calls = hook_calls(tmp_path)
        assert [event for event, _, _, _ in calls] == [
            "SessionStart",
            "UserPromptSubmit",
            "PostToolUse",
            "Stop",
        ]
        assert [c for c in calls if c[1] != "ok"] == [], setup.agent_log()


def test_codex_exec_goes_on_with_a_message_its_stop_hook_found_then_ends(tmp_path: Path) -> None:
    """A message that arrives while the model writes its final answer is in no hook's pull but
    Stop's: the Stop hook blocks with it, Codex sends it to the model as its next prompt, and the
    Stop after that answer (the message now delivered, nothing waiting) lets the turn end."""
    with netns() as space:
        hub, peer, setup = codex_user(space, tmp_path)
        setup.start_model("--no-tool", "--final", "all done", "--final", "done, note read")
        codex = setup.start_codex("Tell me when you are done.")

        # The model holds its final answer: UserPromptSubmit has pulled (nothing), no tool runs.
        wait_until(setup.conversation, timeout=CODEX_TIMEOUT, what="the model's first request")
        [mine] = session_in_bypass(hub, tmp_path, peer["token"])
        hub.send(peer, mine["ref"], "a note from peer")
        setup.release.touch()
        assert codex.popen.wait(timeout=CODEX_TIMEOUT) == 0, codex.log()[-3000:]

    # The prompt, then the Stop hook's reason (no SessionEnd hook: Codex's MCP server ends it).
    assert_stop_hook_handed_over(tmp_path, setup.conversation(), peer, "a note from peer", "all done")
    # What `codex exec --json` reported the model said: its answer, then its answer after the note.
    said = [
        e["item"]["text"] for e in events(codex.log()) if e.get("item", {}).get("type") == "agent_message"
    ]
    assert said == ["all done", "done, note read"], codex.log()[-3000:]

    # The second Stop reported the session idle with the answer after the message; it ended with Codex.
    row = row_of(tmp_path, mine)
    assert (row["status"], row["final_answer"]) == ("exited", "done, note read"), row


def test_codex_finishes_its_turn_promptly_without_a_hub(tmp_path: Path) -> None:
    with netns() as space:  # a hub that is stopped: its key is there, nothing listens on its port
        setup = CodexSetup(space, tmp_path)
        (tmp_path / ".switchboard").mkdir()
        (tmp_path / ".switchboard" / "enroll.key").write_text("sbk_a-hub-that-is-stopped\n")
        setup.install_hooks()
        setup.trust()
        setup.start_model()
        setup.release.touch()
        started = time.monotonic()
        codex = setup.start_codex("Say hello to peer on Switchboard.")
        assert codex.popen.wait(timeout=CODEX_TIMEOUT) == 0, codex.log()[-3000:]
        took = time.monotonic() - started

        calls = hook_calls(tmp_path)
        print(f"codex exec without a hub: {took:.1f} s; hook calls (event, outcome, ms): {calls}")
        # Codex runs no PostToolUse hook after a failed tool call (send_message: the hub is away).
        assert {event for event, _, _, _ in calls} == {"SessionStart", "UserPromptSubmit", "Stop"}
        assert all(ms < HOOK_DEADLINE_MS for _, _, ms, _ in calls), calls
        assert '"agent_message","text":"done"' in codex.log()


def thread_of(log: str) -> str:
    """The id of the conversation (thread) `codex exec --json` ran, as it printed it."""
    [started] = [e["thread_id"] for e in events(log) if e.get("type") == "thread.started"]
    return started


def test_a_codex_conversation_resumed_by_a_new_codex_exec_is_that_process_s_own_session(
    tmp_path: Path,
) -> None:
    """Codex passes its MCP servers no session id: a Codex process has one hub session, its MCP
    server's and its hooks' alike, ended by the MCP server as Codex exits (docs/agents.md). So
    `codex exec resume --last` after a `codex exec`, the same conversation in a new process, is
    a new hub session: the first stays exited, and neither process registered a second one."""
    with netns() as space:
        hub, peer, setup = codex_user(space, tmp_path)
        setup.start_model()
        setup.release.touch()
        first = setup.start_codex("Say hello to peer on Switchboard.")
        assert first.popen.wait(timeout=CODEX_TIMEOUT) == 0, first.log()[-3000:]
        [ended] = sessions_named(hub, peer["token"], "proj")
        asked_before = len(setup.conversation())

        resumed = setup.start_codex("Go on.", resume=True)
        assert resumed.popen.wait(timeout=CODEX_TIMEOUT) == 0, resumed.log()[-3000:]
        # Its MCP server ends the session as Codex stops it, which may finish after Codex has exited.

        def both_ended() -> list[dict[str, Any]] | None:
            found = sessions_named(hub, peer["token"], "proj")
            return found if len(found) == 2 and all(s["status"] == "exited" for s in found) else None

        sessions = wait_until(both_ended, timeout=10, what="both sessions ended")
        inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]

    assert thread_of(resumed.log()) == thread_of(first.log())  # the same conversation
    # One hub session per process: the first, ended as its Codex exited, and the resumed one's.
    assert [s["kind"] for s in hub_sessions(tmp_path) if s["ref"] != peer["ref"]] == ["codex", "codex"]
    [new] = [s for s in sessions if s["ref"] != ended["ref"]]
    assert [s["status"] for s in (ended, new)] == ["exited", "exited"], sessions
    # The first process's MCP server sent as its session; the resumed one's hooks told the model
    # the new one, and its MCP server ended that one as Codex exited (Codex runs no SessionEnd hook).
    assert [(m["text"], m["from"]["ref"]) for m in inbox] == [("hello from the model", ended["ref"])], inbox
    told = "\n".join(strings(setup.conversation()[asked_before]))
    assert f"registered on the Switchboard hub as proj [{new['ref']}]" in told, told[-3000:]
    assert row_of(tmp_path, new)["final_answer"] == "done"
    calls = hook_calls(tmp_path)
    assert [event for event, _, _, _ in calls] == [
        *("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"),
        *("SessionStart", "UserPromptSubmit", "Stop"),
    ], calls
    assert [c for c in calls if c[1] != "ok"] == [], setup.agent_log()


# Esc as the interactive Codex reads it on this pseudo-terminal.
ESCAPE = b"\x1b"
# Events that could tell a hook a turn has ended, each recorded (its JSON input, one line) by a
# hook of the test's own.
TURN_END_EVENTS = ("Interrupt", "Stop")


def test_an_interactive_codex_interrupted_mid_turn_runs_its_interrupt_hook_and_shows_idle(
    tmp_path: Path,
) -> None:
    """Esc in the interactive Codex ends a turn with its `Interrupt` hook and no Stop: the hub
    shows the session idle at once, with no final answer, and the next prompt busy again. The
    model holds its answer (nothing releases it), so the first turn ends only by the interrupt."""
    recorded = tmp_path / "turn-end-events.jsonl"
    with netns() as space:
        hub, peer, setup = codex_user(space, tmp_path, record=(recorded, TURN_END_EVENTS))
        setup.trust_project()
        setup.start_model()
        # The TUI with its app server inside its own process, not the background daemon it starts
        # by default (which would outlive the test); both run the same hooks.
        terminal = Terminal(space, [setup.codex, "--no-daemon"], setup.env, setup.project)
        try:
            # Codex runs SessionStart with the first turn, not as its prompt comes up.
            terminal.until(lambda: "Ask Codex to do anything" in terminal.screen(), "the prompt")
            terminal.type("Say hello to peer on Switchboard.")
            terminal.until(setup.conversation, "the model's first request", timeout=CODEX_TIMEOUT)
            terminal.until(hooks_began_with(tmp_path, "SessionStart", "UserPromptSubmit"), "the turn's start")
            [mine] = sessions_named(hub, peer["token"], "proj")
            in_turn = row_of(tmp_path, mine)["status"]
            os.write(terminal.master, ESCAPE)
            terminal.until(lambda: recorded.exists() and "Interrupt" in recorded.read_text(), "the interrupt")
            # Its hooks run together; Switchboard's has the same deadline as any (HOOK_DEADLINE_MS).
            deadline = time.monotonic() + HOOK_DEADLINE_MS / 1000 + 5
            while row_of(tmp_path, mine)["status"] != "idle" and time.monotonic() < deadline:
                time.sleep(0.2)
            after_interrupt = row_of(tmp_path, mine)

            terminal.type("Go on.")
            terminal.until(
                lambda: [event for event, *_ in hook_calls(tmp_path)].count("UserPromptSubmit") == 2,
                "the next prompt's hook",
            )
            next_turn = row_of(tmp_path, mine)["status"]
        finally:
            terminal.close()

    assert in_turn == "busy"
    [interrupt] = [json.loads(line) for line in recorded.read_text().splitlines() if line.strip()]
    assert interrupt["hook_event_name"] == "Interrupt", interrupt  # and no Stop
    assert (after_interrupt["status"], after_interrupt["final_answer"]) == ("idle", ""), after_interrupt
    assert next_turn == "busy"
    calls = hook_calls(tmp_path)
    assert [event for event, _, _, _ in calls] == [
        *("SessionStart", "UserPromptSubmit", "Interrupt", "UserPromptSubmit")
    ], calls
    assert [c for c in calls if c[1] != "ok"] == [], setup.agent_log()


def turns_ended(home: Path) -> int:
    """How many Stop hooks the Codex processes under `home` have run (one per finished turn)."""
    return [event for event, _, _, _ in hook_calls(home)].count("Stop")


def switchboard_mcp_servers(space: Netns) -> int:
    """How many Switchboard MCP servers (`switchboard mcp`) run in the namespace: Codex starts one
    for each conversation."""
    count = 0
    for pid in space.pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        count += len(argv) > 2 and argv[-2] == b"mcp" and argv[-3].endswith(b"/switchboard")
    return count


def test_two_interactive_codex_tuis_on_one_daemon_are_two_hub_sessions(tmp_path: Path) -> None:
    """The interactive `codex` of 0.171 runs its conversations in a background app server that the
    first TUI starts (`codex app-server --managed-daemon`) and the next one attaches to; the hooks
    and each conversation's MCP server (one per conversation) are that daemon's children. Two TUIs
    in one project are two agents: each must be a hub session of its own, told to its model and
    reported idle with its turn's answer, its tool calls sent as it."""
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer")  # `default`, as the TUIs run: nothing they send is held
        setup = CodexSetup(space, tmp_path)
        setup.install_hooks()
        setup.trust()
        setup.trust_project()
        setup.start_model("--each-conversation")  # each conversation sends to the peer, then "done"
        setup.release.touch()
        tuis: list[Terminal] = []
        try:
            for turn, prompt in enumerate(("Say hello.", "Say hello too."), 1):
                tui = Terminal(space, [setup.codex], setup.env, setup.project)
                tuis.append(tui)
                # The prompt shows before the daemon has started the TUI's conversation (and its
                # MCP server); a prompt typed before that is not sent.
                tui.until(lambda n=turn: switchboard_mcp_servers(space) == n, "the conversation's MCP server")
                tui.until(lambda t=tui: "Ask Codex to do anything" in t.screen(), "the prompt")
                tui.type(prompt)
                tui.until(
                    lambda n=turn: turns_ended(tmp_path) == n, f"turn {turn}'s end", timeout=CODEX_TIMEOUT
                )
            sessions = sessions_named(hub, peer["token"], "proj")
            rows = [row_of(tmp_path, s) for s in sessions]
            inbox = hub.call("GET", "inbox", peer["token"])["body"]["messages"]
        finally:
            for tui in tuis:
                tui.close()
            # The daemon outlives both TUIs: the namespace's end kills it (Netns.kill_leftovers).

    # Two hub sessions, each a Codex one, each idle with its turn's answer.
    assert [(r["kind"], r["status"], r["final_answer"]) for r in rows] == [("codex", "idle", "done")] * 2, (
        rows
    )
    # Each TUI's model was told its own session.
    told = {
        ref
        for body in setup.conversation()
        for ref in {s["ref"] for s in sessions}
        if f"registered on the Switchboard hub as proj [{ref}]" in "\n".join(strings(body))
    }
    assert told == {s["ref"] for s in sessions}
    # Each TUI's model sent as its own session.
    assert sorted(m["from"]["ref"] for m in inbox) == sorted(s["ref"] for s in sessions), inbox
    calls = hook_calls(tmp_path)
    assert [c for c in calls if c[1] != "ok"] == [], setup.agent_log()
