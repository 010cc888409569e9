"""`switchboard listen --socket PATH`: the receiving end of the local socket inbox.

It listens on a Unix socket (mode 0600) for one session: the one it registers (`--register`), else
the one its token stands for (`SWITCHBOARD_TOKEN` or `--session`). It reads one JSON frame per
connection; a frame for that session (its `recipient_id`) is printed (or appended to a file) and
answered `{"ack": "<message id>"}`, so the hub marks the delivery delivered. Any other frame is
refused with `{"refused": "<message id>", "reason": "recipient"}` and logged to stderr, never shown:
another session may have registered this socket as its own address, and its messages must not
pass for this session's. The wire protocol is `messaging.uds`'s.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from switchboard_agent.delivery_text import render_messages

MAX_FRAME_BYTES = 16 * 1024 * 1024 + 1
# Never shown: the printer's budget fits any frame (a frame is at most MAX_FRAME_BYTES).
REREAD = "run `switchboard inbox --unacked` as this session"
READ_TIMEOUT = 10.0


def bind_socket(path: str) -> socket.socket:
    """A listening Unix socket at `path` (0600). A stale socket file left by a dead listener is
    replaced; anything else at that path is an error."""
    target = Path(path)
    if target.exists() or target.is_symlink():
        if not stat.S_ISSOCK(target.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket.")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(0.5)
            probe.connect(path)
        except OSError:
            target.unlink()  # nobody listens there any more
        else:
            raise FileExistsError(f"Another listener is already on {path}.")
        finally:
            probe.close()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(old_umask)
    server.listen(16)
    return server


def read_frame(conn: socket.socket, *, timeout: float = READ_TIMEOUT) -> dict[str, Any] | None:
    """One newline-terminated JSON frame from a connection, or None when it is not one."""
    conn.settimeout(timeout)
    buffer = b""
    while b"\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer += chunk
        if len(buffer) > MAX_FRAME_BYTES:
            return None
    try:
        frame = json.loads(buffer.split(b"\n", 1)[0])
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


def serve(
    server: socket.socket,
    on_frame: Callable[[dict[str, Any]], None],
    *,
    session_id: str,
    count: int | None = None,
    seconds: float | None = None,
) -> int:
    """Take the frames for `session_id` until `count` frames or `seconds` have passed (forever when
    both are None); refuse the others. Returns how many frames were taken."""
    taken = 0
    deadline = time.monotonic() + seconds if seconds is not None else None
    while count is None or taken < count:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            server.settimeout(min(left, 1.0))
        else:
            server.settimeout(None)
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            try:
                frame = read_frame(conn)
                if frame is None:
                    continue
                message_id = str(frame.get("id", ""))
                if frame.get("recipient_id") != session_id:
                    refuse(conn, message_id, frame.get("recipient_id"))
                    continue
                on_frame(frame)
                conn.sendall(json.dumps({"ack": message_id}).encode("utf-8") + b"\n")
                taken += 1
            except OSError:
                continue  # the hub gave up on this connection; it will retry
    return taken


def refuse(conn: socket.socket, message_id: str, recipient: object) -> None:
    """Answer a frame for another session with a refusal (the hub then leaves the message queued
    for that session to pull) and log it, ids only."""
    conn.sendall(json.dumps({"refused": message_id, "reason": "recipient"}).encode("utf-8") + b"\n")
    print(
        f"switchboard listen: refused message {message_id!r}: it is for session {recipient!r}, not the "
        "one this socket listens for (another session may have registered this socket as its address).",
        file=sys.stderr,
        flush=True,
    )


def frame_printer(out: IO[str], *, as_json: bool) -> Callable[[dict[str, Any]], None]:
    """Print each frame: a JSON line, or the message as every agent-side surface shows one
    (`delivery_text.render_messages`), between lines carrying a boundary drawn at random, so a
    message's text cannot end it early or pass for another message (or the hub's notice)."""

    def show(frame: dict[str, Any]) -> None:
        if as_json:
            out.write(json.dumps(frame, ensure_ascii=False) + "\n")
        else:
            out.write(render_messages([frame], budget=sys.maxsize, how_to_reread=REREAD) + "\n\n")
        out.flush()

    return show


def frame_appender(path: str) -> Callable[[dict[str, Any]], None]:
    def append(frame: dict[str, Any]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(frame, ensure_ascii=False) + "\n")

    return append


def listen(
    path: str,
    *,
    session_id: str,
    out_file: str | None,
    as_json: bool,
    count: int | None,
    seconds: float | None,
) -> int:
    """Bind, take the frames for `session_id`, clean up the socket file. Returns how many frames
    were taken."""
    server = bind_socket(path)
    handler = frame_appender(out_file) if out_file else frame_printer(sys.stdout, as_json=as_json)
    try:
        return serve(server, handler, session_id=session_id, count=count, seconds=seconds)
    finally:
        server.close()
        Path(path).unlink(missing_ok=True)
