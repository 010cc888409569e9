"""The local socket transport: hand one frame to a session listening on a Unix socket.

Wire protocol (one connection per frame):
  hub → receiver: the frame as one line of JSON (`json.dumps`, UTF-8, ending in "\\n"); its
    `recipient_id` is the id of the session the message is for;
  receiver → hub: one line `{"ack": "<message id>"}` once it has taken the frame, or
    `{"refused": "<message id>", "reason": "<why>"}` when it will not take it.

A receiver takes only frames whose `recipient_id` is the session it listens for, and refuses the
rest (reason `recipient`): a session's socket address is whatever its registration said, so
another session may name the same socket, and a frame for it must not pass for this session's
message. The hub counts a frame as delivered only when the ack arrives, so a receiver that accepts
the connection but never reads leaves the message queued (and pullable) instead of lost in a
kernel buffer; a refusal is permanent for that delivery: the message stays queued for its own
session to pull and is not written to the socket again. Every step has a bounded timeout.
Failures are `TransientSocketError` (worth retrying: no listener yet, refused connection, timed
out) or `PermanentSocketError` (retrying cannot help: bad address, not a socket, permission
denied, a frame too large, a listener of another user, a frame the receiver refused). This module
knows nothing of the ORM.

Only a listener running as the hub's own user (or root) is handed a frame: a session's socket
address outlives its listener, and in a shared folder such as /tmp another account could bind the
same path. Who listens is read from the connected socket itself (SO_PEERCRED) before a byte of the
frame is written; where the system has no SO_PEERCRED, from the owner of the socket file.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct
import time
from typing import Any

UDS_PREFIX = "uds:"
MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_ACK_BYTES = 4096
# AF_UNIX paths are limited to 108 bytes on Linux (104 on macOS), including the NUL.
MAX_PATH_BYTES = 107


class SocketDeliveryError(Exception):
    """A frame could not be handed over."""


class TransientSocketError(SocketDeliveryError):
    """Worth retrying later."""


class PermanentSocketError(SocketDeliveryError):
    """Retrying the same frame to the same address cannot succeed."""


PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOTSOCK, errno.ENAMETOOLONG, errno.EISDIR})


def socket_path(address: str) -> str:
    """The filesystem path in a `uds:/path/to.sock` peer address."""
    if not address.startswith(UDS_PREFIX):
        raise PermanentSocketError("The peer address is not a `uds:` address.")
    path = address[len(UDS_PREFIX) :]
    if not path.startswith("/"):
        raise PermanentSocketError("A `uds:` address needs an absolute path.")
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise PermanentSocketError(f"The socket path is longer than {MAX_PATH_BYTES} bytes.")
    return path


def encode_frame(frame: dict[str, Any]) -> bytes:
    """The frame as one newline-terminated JSON line. json.dumps escapes every newline inside
    strings, so a message can never split the line or forge a second frame."""
    data = json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    if len(data) > MAX_FRAME_BYTES:
        raise PermanentSocketError(
            f"The frame is {len(data)} bytes; the socket transport takes {MAX_FRAME_BYTES}."
        )
    return data


def write_frame(address: str, frame: dict[str, Any], *, timeout: float = 5.0) -> None:
    """Connect, write the frame, wait for the receiver's ack; all within `timeout` seconds."""
    path = socket_path(address)
    data = encode_frame(frame)
    try:
        found = os.stat(path)
    except FileNotFoundError:
        pass  # the listener may not have started yet: connect fails below, transiently
    else:
        if not stat.S_ISSOCK(found.st_mode):
            raise PermanentSocketError("The peer address names a file that is not a socket.")
        _check_owner(found.st_uid, "owns the socket file")
    expected = str(frame.get("id", ""))
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(path)
            listener = _listener_uid(sock)
            if listener is not None:
                _check_owner(listener, "is listening on the socket")
            sock.settimeout(_remaining(deadline))
            sock.sendall(data)
            ack = _read_line(sock, deadline)
        except TimeoutError as exc:
            raise TransientSocketError(f"The receiver did not take the frame within {timeout:g} s.") from exc
        except OSError as exc:
            if exc.errno in PERMANENT_ERRNOS:
                raise PermanentSocketError(f"Cannot write to the socket: {exc.strerror}.") from exc
            raise TransientSocketError(f"Cannot write to the socket: {exc.strerror or exc}.") from exc
    finally:
        sock.close()
    try:
        parsed = json.loads(ack)
    except ValueError as exc:
        raise TransientSocketError("The receiver answered something that is not a JSON ack.") from exc
    if isinstance(parsed, dict) and "refused" in parsed:
        reason = str(parsed.get("reason", ""))[:100]
        raise PermanentSocketError(
            f"The receiver refused the frame (reason: {reason or 'none given'}); it is not written "
            "there again, and the message stays queued for its session to pull."
        )
    if not isinstance(parsed, dict) or str(parsed.get("ack", "")) != expected:
        raise TransientSocketError("The receiver did not acknowledge this frame.")


def _trusted_uids() -> frozenset[int]:
    """The users a frame may be handed to: the hub's own, and root (who can read it anyway)."""
    return frozenset({os.geteuid(), 0})


def _check_owner(uid: int, role: str) -> None:
    if uid not in _trusted_uids():
        raise PermanentSocketError(
            f"Another user (uid {uid}) {role}, not the hub's; the message stays queued for the "
            "session to pull. Put the socket in a folder only its user can write."
        )


def _listener_uid(sock: socket.socket) -> int | None:
    """The user id of the process on the other end of a connected Unix socket, or None where the
    system cannot tell (no SO_PEERCRED): then the socket file's owner, checked before, stands."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    credentials = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    buffer = b""
    while b"\n" not in buffer:
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(MAX_ACK_BYTES)
        if not chunk:
            raise TransientSocketError("The receiver closed the connection without an ack.")
        buffer += chunk
        if len(buffer) > MAX_ACK_BYTES:
            raise TransientSocketError("The receiver's ack is too long.")
    return buffer.split(b"\n", 1)[0]
