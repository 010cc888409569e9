"""A hook never stalls the agent, whatever the hub does, for every event each client runs.

`test_hook_deadlines.py` runs Claude Code's events behind a hub that accepts and never answers.
Here the rest: each client's events (Claude Code, Codex CLI, Gemini CLI; docs/agents.md), each run
the way its client runs it (Claude Code: the hook line itself; Codex: through `$SHELL -lc`; Gemini:
through `bash -c` with the `|| true` install-hooks adds), behind
- a listener that accepts and never answers (for Codex and Gemini),
- one that answers a byte per second (a per-read timeout never fires),
- nothing listening,
- a hub that answers every request HTTP 500,
each event in a home of its own (so the breaker one failure trips does not spare the next), all of
one client's events at once. Each must exit 0 with nothing on stdout (what every client takes as
"go on"), within the hook's deadline (3 s, counted from its process's start) plus Python's start.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hub_topology import REPO, free_port
from hub_topology.hung import HungHub
from switchboard_agent.config import SavedSession, process_session_key, session_save
from switchboard_agent.identity import client_anchor
from switchboard_agent.install import hook_line
from tests.agents.codex_payloads import codex_event

HOOK_DEADLINE = 3.0  # switchboard_agent.hooks.HOOK_DEADLINE
# The process as a whole: the deadline, plus Python's start-up beyond the share the hook counts
# (several hooks start at once here, on a loaded machine), plus the shell in between.
WITHIN = HOOK_DEADLINE + 3.0
SESSION_ID = "5e1f0c2a-1b2c-4d3e-8f4a-9b8c7d6e5f4a"
BASE = {"session_id": SESSION_ID, "transcript_path": "/tmp/none.jsonl", "cwd": "/work/payments"}
# Each client's events, with the fields it sends (docs/agents.md, the tables per client).
CLIENT_EVENTS: dict[str, dict[str, dict[str, Any]]] = {
    "claude": {
        "SessionStart": {"source": "startup"},
        "UserPromptSubmit": {"prompt": "go on", "permission_mode": "default"},
        "PostToolUse": {"tool_name": "Bash", "tool_input": {"command": "make"}, "permission_mode": "default"},
        "Stop": {"stop_hook_active": False, "last_assistant_message": "Done.", "permission_mode": "default"},
        "SessionEnd": {"reason": "prompt_input_exit"},
    },
    "gemini": {
        "SessionStart": {"source": "startup"},
        "BeforeAgent": {"prompt": "go on"},
        "AfterTool": {"tool_name": "run_shell_command", "tool_input": {"command": "make"}},
        "AfterAgent": {"prompt": "go on", "prompt_response": "Done.", "stop_hook_active": False},
        "SessionEnd": {"reason": "exit"},
    },
    "codex": {
        "SessionStart": {"source": "startup"},
        "UserPromptSubmit": {"prompt": "go on"},
        "PostToolUse": {"tool_name": "Bash", "tool_input": {"command": "make"}, "tool_use_id": "call_1"},
        "Stop": {"stop_hook_active": False, "last_assistant_message": "Done."},
        # The `notify` program of a config written before Codex had hooks: the JSON is an argument.
        "agent-turn-complete": {"last-assistant-message": "Done."},
    },
}


class Served:
    """A socketserver on 127.0.0.1 running in a thread of its own; `accepted` counts its callers."""

    def __init__(self, server: socketserver.TCPServer) -> None:
        self.accepted = 0
        self._stop = threading.Event()
        self._server = server
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class DripHub(Served):
    """Accepts, reads the request, then answers a 200 one byte per second: each read gets a byte
    well within any per-read timeout, so only an overall deadline ends the wait."""

    ANSWER = (
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"messages": ['
    )

    def __init__(self) -> None:
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.accepted += 1
                self.request.settimeout(1.0)
                try:
                    self.request.recv(65536)
                    for byte in owner.ANSWER + b" " * 4096:
                        if owner._stop.wait(1.0):
                            return
                        self.request.sendall(bytes([byte]))
                except OSError:
                    return  # the hook gave up and closed the connection

        super().__init__(socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler))


class FailingHub(Served):
    """Answers every request HTTP 500 with a JSON error body, at once."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _fail(self) -> None:
                owner.accepted += 1
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = b'{"error": "internal", "detail": "Server Error (500)"}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _fail

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(ThreadingHTTPServer(("127.0.0.1", 0), Handler))


class NobodyListening:
    """A loopback port nothing listens on (taken, then let go)."""

    def __init__(self) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"

    accepted = None  # nothing to count

    def close(self) -> None:
        pass


HUBS = {"hung": HungHub, "drip": DripHub, "nothing listening": NobodyListening, "answers 500": FailingHub}
# Claude Code behind a hung hub: test_hook_deadlines.py.
CASES = [(c, h) for c in CLIENT_EVENTS for h in HUBS if (c, h) != ("claude", "hung")]


@pytest.fixture
def hub(request: pytest.FixtureRequest) -> Iterator[Any]:
    server = HUBS[request.param]()
    try:
        yield server
    finally:
        server.close()


def payload(client: str, name: str) -> dict[str, Any]:
    fields = CLIENT_EVENTS[client][name]
    if name == "agent-turn-complete":
        return {"type": name, "thread-id": "t", "turn-id": "u", **fields}
    if client == "codex":
        return codex_event(name, **fields)
    return {**BASE, "hook_event_name": name, **fields}


def client_argv(client: str, url: str, name: str) -> tuple[list[str], str]:
    """The command line the client runs for event `name`, and what it writes to the hook's stdin."""
    line = hook_line(client, url=url)
    event = json.dumps(payload(client, name))
    if client == "gemini":
        return ["bash", "-c", f"{line} || true"], event
    if client == "codex":
        shell = os.environ.get("SHELL") or "/bin/bash"
        if name == "agent-turn-complete":
            return [shell, "-lc", f"{line} {shlex.quote(event)}"], ""
        return [shell, "-lc", line], event
    return ["bash", "-c", line], event


def saved_before(client: str, home: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session its hooks (or, for Codex, its MCP server) registered earlier, so each later
    event makes its own request. For Codex the key and process are this test's: it is the process
    each hook runs under, past the shell."""
    monkeypatch.setenv("SWITCHBOARD_HOME", str(home))
    anchor = client_anchor(os.getpid())
    key = process_session_key("codex", anchor) if client == "codex" else SESSION_ID
    session_save(
        SavedSession(
            key=key,
            hub=url,
            token="t" * 40,
            id="i",
            name="payments",
            ref="abc123",
            anchor=anchor,
            client=client,
        )
    )


@pytest.mark.e2e
@pytest.mark.parametrize(("client", "hub"), CASES, indirect=["hub"], ids=[f"{c}-{h}" for c, h in CASES])
def test_every_event_of_each_client_ends_in_time_and_lets_the_agent_go_on(
    client: str, hub: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_CODE_"))}
    env["SWITCHBOARD_ENROLL_KEY"] = "k" * 32
    runs: dict[str, tuple[subprocess.Popen[str], float, str]] = {}
    for name in CLIENT_EVENTS[client]:
        home = tmp_path / name
        if name != "SessionStart":
            saved_before(client, home, hub.url, monkeypatch)
        argv, stdin = client_argv(client, hub.url, name)
        started = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "SWITCHBOARD_HOME": str(home)},
            cwd=REPO,
        )
        assert process.stdin is not None
        process.stdin.write(stdin)
        process.stdin.close()  # as the clients do once the event is written
        runs[name] = (process, started, str(home))

    took: dict[str, float] = {}
    try:
        for name, (process, started, _) in runs.items():
            process.wait(timeout=max(0.1, started + WITHIN + 10 - time.monotonic()))
            took[name] = time.monotonic() - started
    finally:
        for process, _, _ in runs.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    for name, (process, _, home) in runs.items():
        assert process.stdout is not None and process.stderr is not None
        out, err = process.stdout.read(), process.stderr.read()
        log = (Path(home) / "agent.log").read_text().splitlines()
        assert process.returncode == 0, (name, err)
        assert out == "", (name, out)  # fail open: nothing for the client to act on
        assert log and " WARNING hook " in log[-1], (name, log)  # the failure is logged
        inside = float(re.search(r"([\d.]+) ms$", log[-1])[1]) / 1000
        assert inside < HOOK_DEADLINE + 0.5, f"{client} {name} took {inside:.1f} s inside the hook"
        assert took[name] < WITHIN, f"{client} {name} took {took[name]:.1f} s: {log[-1]}"
    if hub.accepted is not None:
        assert hub.accepted >= 1  # the hooks did reach it


@pytest.mark.e2e
@pytest.mark.parametrize("client", ["claude", "gemini"])
def test_a_first_hook_waiting_for_the_session_lock_ends_in_time(
    client: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP server started beside the hooks registers the session under the hooks' lock (Claude
    Code's, by its session id), and holds it while its own registration waits on a hub that never
    answers: a first hook of that session waits for the lock inside its deadline, not past it."""
    from switchboard_agent.config import session_lock

    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "CLAUDE_CODE_"))}
    env |= {"SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_ENROLL_KEY": "k" * 32}
    with HungHub() as hub, session_lock(SESSION_ID):
        argv, stdin = client_argv(client, hub.url, "SessionStart")
        started = time.monotonic()
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=env, cwd=REPO, timeout=60
        )
        took = time.monotonic() - started
    assert done.returncode == 0 and done.stdout == ""
    assert took < WITHIN, f"the hook waited {took:.1f} s for the lock"
    assert "deadline" in (tmp_path / "agent.log").read_text().splitlines()[-1]
