"""The agent side hands its enrollment key and session tokens only to a hub run by its own user.

The attack: another local Unix user binds the hub's loopback port while the hub is down (or
before it starts, or after it moved to another port), and every hook, MCP server and CLI call
that goes there sends it `Authorization: Bearer <enrollment key>` or a session's token, which
work on the real hub once it is back. A listener's owner is read from the kernel's socket table
(`/proc/net/tcp`, `/proc/net/tcp6`) before a byte is written. "Another user" is simulated with a
child process that drops to uid 65534 (nobody) before it binds, so these tests need root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from switchboard_agent.client import HubClient, HubUnreachable
from switchboard_agent.transport import HTTPTransport

NOBODY = 65534
ENROLL_KEY = "enroll-key-of-the-victim-" + "k" * 20
SESSION_TOKEN = "sbs_token-of-the-victim-" + "t" * 20

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not Path("/proc/net/tcp").exists(),
    reason="needs root (to act as another user) and Linux's socket table",
)
pytestmark = needs_root

# The squatter: drops to `nobody`, then binds (so the listening socket is nobody's), prints its
# port, and for each connection records every byte it is sent, then answers a 401, for a few seconds.
SQUATTER = r"""
import json, os, socket, sys, time
family, host = (socket.AF_INET6, "::") if sys.argv[1] == "dual" else (socket.AF_INET, "127.0.0.1")
os.setgid(65534)
os.setuid(65534)
server = socket.socket(family, socket.SOCK_STREAM)
if family == socket.AF_INET6:
    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
server.bind((host, 0))
server.listen(8)
print(server.getsockname()[1], flush=True)
server.settimeout(0.5)
deadline = time.monotonic() + 8
while time.monotonic() < deadline:
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    conn.settimeout(1.0)
    got = b""
    try:
        while b"\r\n\r\n" not in got and len(got) < 65536:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        # Recorded before the answer: once the caller has its answer, the record is written.
        print(json.dumps(got.decode("latin-1")), flush=True)
        if got:
            conn.sendall(b'HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n'
                         b'Content-Length: 2\r\nConnection: close\r\n\r\n{}')
    except OSError:
        pass
    conn.close()
"""


@dataclass
class Squatter:
    port: int
    process: subprocess.Popen[str]

    def received(self) -> str:
        """Everything the squatter was sent (it exits within its own deadline)."""
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        return "".join(json.loads(line) for line in out.splitlines() if line.strip())


def _squat(how: str) -> Iterator[Squatter]:
    process = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, how], stdout=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert process.stdout is not None
        yield Squatter(int(process.stdout.readline()), process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def squatter() -> Iterator[Squatter]:
    yield from _squat("v4")


@pytest.fixture
def dual_stack_squatter() -> Iterator[Squatter]:
    yield from _squat("dual")


def _client(port: int, token: str | None = None) -> HubClient:
    return HubClient(f"http://127.0.0.1:{port}", token, transport=HTTPTransport(), timeout=3.0)


def test_the_enrollment_key_is_not_sent_to_another_users_listener(squatter: Squatter) -> None:
    with _client(squatter.port) as client, pytest.raises(HubUnreachable) as refused:
        client.register(name="victim", key=ENROLL_KEY)
    assert "another local user" in refused.value.detail
    assert "uid 65534" in refused.value.detail
    assert ENROLL_KEY not in squatter.received()


def test_a_session_token_is_not_sent_to_another_users_listener(squatter: Squatter) -> None:
    with _client(squatter.port, SESSION_TOKEN) as client, pytest.raises(HubUnreachable):
        client.me()
    received = squatter.received()
    assert SESSION_TOKEN not in received
    assert received == ""  # not a byte of the request


def test_a_dual_stack_listener_of_another_user_is_refused_too(dual_stack_squatter: Squatter) -> None:
    """An IPv4 caller of a `[::]` listener shows in the IPv6 table as ::ffff:127.0.0.1."""
    with _client(dual_stack_squatter.port, SESSION_TOKEN) as client, pytest.raises(HubUnreachable):
        client.me()
    assert SESSION_TOKEN not in dual_stack_squatter.received()


def test_a_hub_user_named_in_the_environment_is_trusted(
    squatter: Squatter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub deliberately run by another account (a service user) is named by the operator."""
    monkeypatch.setenv("SWITCHBOARD_HUB_USER", "nobody")
    with _client(squatter.port, SESSION_TOKEN) as client, pytest.raises(Exception) as answered:
        client.me()
    assert getattr(answered.value, "status", None) == 401  # the listener's own answer
    assert SESSION_TOKEN in squatter.received()


class _Hub(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Hub.seen.append(self.headers.get("Authorization", ""))
        body = b'{"id": "x", "name": "me", "ref": "abcdef"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_listener_of_this_user_is_used() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        with _client(server.server_address[1], SESSION_TOKEN) as client:
            assert client.me()["ref"] == "abcdef"
        assert _Hub.seen == [f"Bearer {SESSION_TOKEN}"]
    finally:
        server.shutdown()
        server.server_close()
