"""A session's local socket inbox (`uds:/path`) is handed frames only by a listener of the hub's
own user: the address outlives the session's listener, and in a shared folder such as /tmp another
account can bind the same path and take (and ack) the session's messages.

The attacker is a forked child that becomes `nobody` and listens on the path; the tests need root
to switch users and are skipped otherwise."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from messaging import uds
from messaging.uds import PermanentSocketError, write_frame

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as a second user"
)


@dataclass
class Squatter:
    """Another account listening on the session's socket path."""

    path: str
    pid: int
    loot: int  # read end of a pipe: what the squatter received

    def received(self) -> bytes:
        """What the squatter was handed. Called after the write returned or raised: a frame it was
        written and acked is in the pipe by then, so stopping a squatter still waiting loses none."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return os.read(self.loot, 4096)


def _listen_as_nobody(path: str, ready: int, loot: int) -> None:
    """In the forked child: become `nobody`, listen on `path`, ack one frame, report what came."""
    try:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        os.write(ready, b"1")
        server.settimeout(5)
        try:
            conn, _ = server.accept()
        except TimeoutError:
            return
        conn.settimeout(2)
        try:
            line = conn.recv(65536).split(b"\n", 1)[0]
        except TimeoutError:
            line = b""
        os.write(loot, line[:4000])
        if line:
            conn.sendall(json.dumps({"ack": str(json.loads(line).get("id", ""))}).encode() + b"\n")
        conn.close()
    finally:
        os._exit(0)


@pytest.fixture
def squatter() -> Iterator[Squatter]:
    shared = tempfile.mkdtemp(prefix="sb-squat-", dir="/tmp")
    os.chmod(shared, 0o1777)  # a shared folder, as /tmp is
    path = os.path.join(shared, "alice.sock")
    ready_r, ready_w = os.pipe()
    loot_r, loot_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _listen_as_nobody(path, ready_w, loot_w)
    os.close(ready_w)
    os.close(loot_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    squatting = Squatter(path=path, pid=pid, loot=loot_r)
    try:
        yield squatting
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(loot_r)
        Path(path).unlink(missing_ok=True)
        os.rmdir(shared)


FRAME = {"id": "m-1", "text": "the deploy password is hunter2-prod"}


def test_a_socket_file_of_another_user_is_not_written_to(squatter: Squatter) -> None:
    assert os.stat(squatter.path).st_uid == NOBODY
    with pytest.raises(PermanentSocketError, match=f"uid {NOBODY}"):
        write_frame(f"uds:{squatter.path}", FRAME, timeout=3)
    assert b"hunter2" not in squatter.received()


def test_a_listener_of_another_user_is_caught_on_the_connection(squatter: Squatter) -> None:
    """The file's owner can be the hub's user while another user listens (root handed it over
    here): the connection's own credentials decide, before any of the frame is written."""
    os.chown(squatter.path, os.geteuid(), os.getegid())
    with pytest.raises(PermanentSocketError, match="is listening on the socket"):
        write_frame(f"uds:{squatter.path}", FRAME, timeout=3)
    assert squatter.received() == b""


def test_without_peer_credentials_the_socket_files_owner_decides(
    squatter: Squatter, monkeypatch: Any
) -> None:
    """Where the system has no SO_PEERCRED (macOS), the owner of the socket file still stands."""
    monkeypatch.setattr(uds, "_listener_uid", lambda sock: None)
    with pytest.raises(PermanentSocketError, match="owns the socket file"):
        write_frame(f"uds:{squatter.path}", FRAME, timeout=3)
    assert b"hunter2" not in squatter.received()
