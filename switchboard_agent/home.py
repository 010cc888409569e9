"""Switchboard's home folder on this machine ($SWITCHBOARD_HOME, default ~/.switchboard): the agent
side keeps its saved sessions, breaker files and log there; a hub on the same machine keeps its
database, keys and registry there too.

Everything written here through `write_private` is mode 0600 (folder 0700), and replaced atomically.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeHome(Exception):
    """SWITCHBOARD_HOME is a folder another local user can write in. Not an OSError: no caller
    reading a file there may take it for a missing file and carry on."""


def home_dir() -> Path:
    """The folder named by SWITCHBOARD_HOME (default ~/.switchboard), created 0700 if missing.
    Raises UnsafeHome when another user could write in it (`private_folder`)."""
    path = Path(os.environ.get("SWITCHBOARD_HOME") or Path.home() / ".switchboard").expanduser()
    return private_folder(path, "SWITCHBOARD_HOME")


def private_folder(path: Path, name: str) -> Path:
    """`path`, created 0700 if missing; UnsafeHome when another user owns it or group or others can
    write in it. Whoever can write a folder can put files in place of the 0600 ones kept there
    (`hub.url` naming its own server, an `enroll.key` it knows, a saved session, a stored file),
    so nothing in it could be believed. `name` says which setting named it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = path.stat()  # of the folder a symbolic link names, which is the one written to
    mode = stat.S_IMODE(found.st_mode)
    if found.st_uid not in (os.geteuid(), 0):
        raise UnsafeHome(
            f"{path} ({name}) belongs to another user (uid {found.st_uid}), who could replace the "
            "files kept there (the hub's address, keys, saved sessions). Use a folder of your own."
        )
    if mode & 0o022:
        raise UnsafeHome(
            f"{path} ({name}) has mode {mode:04o}: other users can write in it and replace the files "
            f"kept there (the hub's address, keys, saved sessions). Run `chmod 0700 {path}`, or use "
            "a folder of your own."
        )
    return path


def write_private(path: Path, content: str) -> None:
    """Write a file that only its owner can read (0600), replacing any earlier content atomically."""
    written = private_file_beside(path, content)
    try:
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)


def private_file_beside(path: Path, content: str) -> Path:
    """A new 0600 file in `path`'s folder holding `content`, flushed to disk, for the caller to
    move or link to `path`. Nothing is left behind if writing fails."""
    written = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        written.unlink(missing_ok=True)
        raise
    return written
