"""`switchboard listen`: the receiving end of the local socket inbox, on a real Unix socket."""

from __future__ import annotations

import json
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from messaging.models import AgentSession, Delivery
from messaging.uds import write_frame
from switchboard_agent.cli import main
from switchboard_agent.listen import bind_socket


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sbl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_in_thread(*argv: str) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(list(argv))))
    thread.start()
    return thread, codes


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists()


def test_listen_appends_frames_to_a_file_and_acks_them(sock_dir: Path) -> None:
    path, out = sock_dir / "in.sock", sock_dir / "frames.jsonl"
    thread, codes = run_in_thread(
        "listen", "--socket", str(path), "--out", str(out), "--count", "2", "--seconds", "10"
    )
    wait_for(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    write_frame(f"uds:{path}", {"id": "m-1", "text": "first\nline"}, timeout=5)  # returns once acked
    write_frame(f"uds:{path}", {"id": "m-2", "text": "second"}, timeout=5)
    thread.join(timeout=10)

    assert codes == [0]
    frames = [json.loads(line) for line in out.read_text().splitlines()]
    assert [f["text"] for f in frames] == ["first\nline", "second"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not path.exists()  # the socket file is cleaned up


def test_listen_with_nothing_received_exits_1(sock_dir: Path) -> None:
    assert main(["listen", "--socket", str(sock_dir / "q.sock"), "--count", "1", "--seconds", "0.3"]) == 1


def test_a_stale_socket_file_is_replaced_but_a_live_listener_is_not(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens
    live = bind_socket(str(path))
    try:
        with pytest.raises(FileExistsError):
            bind_socket(str(path))
    finally:
        live.close()


@pytest.mark.django_db(transaction=True)
def test_listen_register_receives_a_message_sent_to_its_name(
    inprocess_hub, register, send, sock_dir, capsys
) -> None:
    path = sock_dir / "r.sock"
    thread, codes = run_in_thread(
        "listen",
        "--socket",
        str(path),
        "--register",
        "--name",
        "ci-listener",
        "--json",
        "--count",
        "1",  # acks the frame and deregisters at once, while the hub may not have marked it yet
        "--seconds",
        "10",
    )
    wait_for(path)
    deadline = time.monotonic() + 10
    while not AgentSession.objects.filter(name="ci-listener").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

    sent = send(register("alice"), "ci-listener", "deploy finished")
    thread.join(timeout=20)

    assert codes == [0]
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["text"] == "deploy finished"
    assert Delivery.objects.get(message_id=sent.json_body["id"]).state == "delivered"
    assert AgentSession.objects.get(name="ci-listener").status == "exited"  # deregistered on the way out
