"""Real agent CLIs (Claude Code, Codex CLI, Gemini CLI) against a real hub, with no way out.

Each test gets a network namespace of its own with only loopback up: the hub, a stand-in for the
client's model API (`tests/clients/model_*.py`, answering on 127.0.0.1 there) and the client itself
all run inside it, so nothing a client tries to reach (its model, updates, telemetry) leaves the
machine. The CLIs are the npm packages pinned in `tests/clients/package.json`, installed by
`scripts/test-clients` into `tests/clients/node_modules` (or `SWITCHBOARD_CLIENTS_DIR`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import secrets
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hub_topology import REPO, VENV_BIN, Proc, wait_until

CLIENTS_DIR = Path(os.environ.get("SWITCHBOARD_CLIENTS_DIR", Path(__file__).resolve().parent))
HUB_PORT = 8765

# One request to the hub, made from inside the namespace (the test process is outside it).
_CALL = """
import json, sys, urllib.request, urllib.error
method, url, token, body = json.loads(sys.argv[1])
request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
request.add_header("Content-Type", "application/json")
if token:
    request.add_header("Authorization", f"Bearer {token}")
try:
    with urllib.request.urlopen(request, timeout=10) as answer:
        status, raw = answer.status, answer.read()
except urllib.error.HTTPError as error:
    status, raw = error.code, error.read()
print(json.dumps({"status": status, "body": json.loads(raw) if raw else None}))
"""


def client_bin(name: str) -> Path:
    """The installed CLI `name` (claude, codex, gemini); skips the test when it is not installed."""
    path = CLIENTS_DIR / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.skip(
            f"{name} is not installed: run scripts/test-clients (installs {CLIENTS_DIR}/package.json)"
        )
    return path


@dataclass
class Netns:
    """A network namespace with only loopback; `argv` runs a command inside it."""

    name: str
    procs: list[Proc] = field(default_factory=list)

    def argv(self, *argv: str | os.PathLike[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *map(str, argv)]

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> Proc:
        """Start a long-running process inside the namespace (stopped when the namespace goes)."""
        proc = Proc(name, self.argv(*argv), env, log).start()
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        """The processes that run inside the namespace now."""
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=20)
        return [int(pid) for pid in out.stdout.split()]

    def kill_leftovers(self) -> None:
        """Kill what still runs inside the namespace (only this test's processes are in it): a
        client's background process that outlives it, such as the interactive Codex's app-server
        daemon, which deleting the namespace would leave running."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def run(
        self, argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float, stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace to its end (bounded by `timeout`)."""
        return subprocess.run(
            self.argv(*argv), env=env, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout
        )


@contextmanager
def netns() -> Iterator[Netns]:
    """A namespace of this test's own (needs root, else the test is skipped), deleted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    space = Netns(f"sbcli-{secrets.token_hex(4)}")
    subprocess.run(["ip", "netns", "add", space.name], check=True, capture_output=True, timeout=20)
    try:
        subprocess.run(
            ["ip", "-n", space.name, "link", "set", "lo", "up"], check=True, capture_output=True, timeout=20
        )
        yield space
    finally:
        for proc in reversed(space.procs):
            proc.stop(timeout=5)
        space.kill_leftovers()
        subprocess.run(["ip", "netns", "del", space.name], capture_output=True, timeout=20)


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any Switchboard, hub or model-provider setting, with
    `HOME` and `SWITCHBOARD_HOME` in the test's folder and `PATH` reaching the venv and node."""
    dropped = ("SWITCHBOARD_", "DATABASE_URL", "REDIS_URL", "ANTHROPIC_", "OPENAI_", "GEMINI_", "GOOGLE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped) and k != "CODEX_HOME"}
    env.update(
        HOME=str(home),
        SWITCHBOARD_HOME=str(home / ".switchboard"),
        PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        **extra,
    )
    return env


def install_hooks(project: Path, env: dict[str, str], *args: str) -> str:
    """`switchboard install-hooks ARGS --write` run in `project`, the one command docs/agents.md
    gives a user; what it printed."""
    done = subprocess.run(
        [str(VENV_BIN / "switchboard"), "install-hooks", *args, "--write"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# A `switchboard hook` call as agent.log records it (switchboard_agent.hooks.run_hook).
HOOK_CALL = re.compile(r" (INFO|WARNING) hook (\w+): (.*); \d+ request\(s\), ([\d.]+) ms$")


def hook_calls(home: Path) -> list[tuple[str, str, float, str]]:
    """(event, outcome, milliseconds, log level) of each hook call in the agents' agent.log under
    `home` (the `SWITCHBOARD_HOME` of `clean_env(home)`)."""
    path = home / ".switchboard" / "agent.log"
    lines = path.read_text().splitlines() if path.exists() else []
    found = [HOOK_CALL.search(line) for line in lines]
    return [(m[2], m[3], float(m[4]), m[1]) for m in found if m]


def hooks_began_with(home: Path, *events: str) -> Callable[[], bool]:
    """Whether the hooks of the client under `home` ran these events first, in this order (a check
    for `wait_until` or `Terminal.until`)."""
    return lambda: [event for event, _, _, _ in hook_calls(home)][: len(events)] == list(events)


def strings(value: Any) -> list[str]:
    """Every string in a JSON value (a model request's body: what the model reads, among the rest)."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [text for item in items for text in strings(item)]


def from_peer(peer: dict[str, Any], text: str) -> re.Pattern[str]:
    """`text` sent by `peer` (a session as `HubInNetns.register` returns it) as the hooks hand it
    to a model: the hub's marker line naming the peer, the label line under it, then the text."""
    marker = rf'\[SWITCHBOARD FROM="{re.escape(peer["name"])}" FROM_REF={peer["ref"]} [^\]\n]*\]'
    return re.compile(rf"{marker}\n[^\n]*\n\n{re.escape(text)}")


def assert_stop_hook_handed_over(
    home: Path, bodies: list[Any], peer: dict[str, Any], text: str, answer: str, *, then: tuple[str, ...] = ()
) -> None:
    """A turn of the client under `home` whose Stop hook blocked once, with `text` from `peer`:
    `bodies` (its requests to the model) are two, the first without the message, the second (the
    client went on) with it, in the same conversation as the model's `answer` to the first. The
    hooks ran (none failing) from the session's start to the second Stop, which let the turn end,
    then the events `then`."""
    first, second = bodies
    note = from_peer(peer, text)
    assert not any(note.search(found) for found in strings(first)), strings(first)[-3:]
    assert any(note.search(found) for found in strings(second)), strings(second)[-3:]
    assert answer in strings(second), strings(second)[-3:]
    calls = hook_calls(home)
    blocked_once = ["SessionStart", "UserPromptSubmit", "Stop", "Stop"]
    assert [event for event, _, _, _ in calls] == [*blocked_once, *then], calls
    assert all(level == "INFO" and outcome == "ok" for _, outcome, _, level in calls), calls


def hub_sessions(home: Path) -> list[dict[str, Any]]:
    """Every session the hub under `home` ever registered, with what its API shows only operators
    (its SQLite file, read-only; `id` as stored, without dashes)."""
    with sqlite3.connect(f"file:{home / '.switchboard' / 'switchboard.sqlite3'}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT id, name, ref, kind, status, permission_mode, final_answer FROM messaging_agentsession"
        )
        return [dict(row) for row in rows]


@dataclass
class HubInNetns:
    """`switchboard serve` (embedded) on 127.0.0.1:8765 inside the namespace."""

    space: Netns
    home: Path
    url: str = f"http://127.0.0.1:{HUB_PORT}"

    def call(self, method: str, path: str, token: str | None = None, body: Any = None) -> dict[str, Any]:
        """One request to `/api/v1/<path>` from inside the namespace: `{"status", "body"}`."""
        args = json.dumps([method, f"{self.url}/api/v1/{path}", token, body])
        out = self.space.run([sys.executable, "-c", _CALL, args], env=dict(os.environ), cwd=REPO, timeout=30)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    def register(self, name: str, *, permission_mode: str = "default") -> dict[str, Any]:
        """A plain session (a peer of the client under test): its `token`, `ref` and the rest.
        A client run without asking has what a `default` peer sends it held for a person: its
        peer is then `bypass` too."""
        enroll_key = (self.home / "enroll.key").read_text().strip()
        answer = self.call("POST", "sessions", enroll_key, {"name": name, "permission_mode": permission_mode})
        assert answer["status"] == 201, answer
        return answer["body"]

    def agent_named(self, token: str, name: str) -> dict[str, Any]:
        """The one live session named `name`, as the agents list shows it to the holder of `token`."""
        agents = self.call("GET", f"agents?name={name}", token)["body"]["agents"]
        [found] = [a for a in agents if a["name"] == name]
        return found

    def send(self, sender: dict[str, Any], to: str, text: str) -> dict[str, Any]:
        """`sender` (as `register` returned it) sends `text` to the session whose ref is `to`:
        the hub's answer (201, its delivery `queued`, so the recipient's next pull gets it)."""
        answer = self.call("POST", "messages", sender["token"], {"to": to, "message": text})
        assert answer["status"] == 201 and answer["body"]["status"] == "queued", answer
        return answer["body"]


def hub_in(space: Netns, home: Path) -> HubInNetns:
    """Start the hub inside `space` and wait (≤ 60 s) until it answers. It keeps its files in
    `home/.switchboard`, the `SWITCHBOARD_HOME` of `clean_env(home)`: the agents there find its
    enrollment key as they would on a user's machine."""
    env = clean_env(home, PYTHONUNBUFFERED="1")
    proc = space.start(
        "hub",
        [str(VENV_BIN / "switchboard"), "serve", "--host", "127.0.0.1", "--port", str(HUB_PORT)],
        env,
        home / "hub.log",
    )
    hub = HubInNetns(space, home / ".switchboard")

    def answers() -> bool:
        if not proc.alive():
            raise AssertionError(proc.log()[-3000:])
        return hub.call("GET", "ping")["status"] in (200, 401)

    wait_until(answers, timeout=60, what="the hub in the namespace", interval=0.5)
    return hub


def until_while_running(
    proc: subprocess.Popen[bytes],
    name: str,
    check: Callable[[], bool],
    what: str,
    *,
    timeout: float,
    output: Callable[[], str],
) -> None:
    """Wait (at most `timeout` s) until `check` holds, failing at once if the client `proc` (`name`)
    exits first; either failure shows the client's `output`."""
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"{name} exited before {what}:\n{output()}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}:\n{output()}"
        time.sleep(0.1)


class Terminal:
    """An interactive client (`argv`) in `cwd`, on a pseudo-terminal of 40x120, inside the
    namespace: keys typed in, the screen's text (escape sequences dropped) read back. `enter`: the
    bytes its Enter key sends (a carriage return, unless the client reads that otherwise)."""

    def __init__(
        self,
        space: Netns,
        argv: list[str | os.PathLike[str]],
        env: dict[str, str],
        cwd: Path,
        *,
        enter: bytes = b"\r",
    ) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.name = Path(argv[0]).name
        self.proc = subprocess.Popen(
            space.argv(*argv),
            env=env | {"TERM": "xterm-256color"},
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,  # a client that relaunches itself as a child: close() ends both
        )
        os.close(slave)
        self.master, self.out, self.enter = master, bytearray(), enter
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.out.extend(data)

    def screen(self) -> str:
        return re.sub(r"\x1b\[[0-9;?<>]*[a-zA-Z]", "", bytes(self.out).decode(errors="replace"))

    def settle(self, quiet: float = 1.0, timeout: float = 10) -> None:
        """Wait until the screen has not changed for `quiet` seconds: keys typed while the client
        is still redrawing (just after /clear) can be lost."""
        deadline = time.monotonic() + timeout
        seen, since = len(self.out), time.monotonic()
        while time.monotonic() - since < quiet and time.monotonic() < deadline:
            time.sleep(0.1)
            if len(self.out) != seen:
                seen, since = len(self.out), time.monotonic()

    def type(self, text: str) -> None:
        """Type `text`, then Enter."""
        self.settle()
        for char in text:
            os.write(self.master, char.encode())
            time.sleep(0.02)
        time.sleep(0.3)
        os.write(self.master, self.enter)

    def until(self, check: Callable[[], bool], what: str, timeout: float = 30) -> None:
        until_while_running(
            self.proc, self.name, check, what, timeout=timeout, output=lambda: self.screen()[-3000:]
        )

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        os.close(self.master)
