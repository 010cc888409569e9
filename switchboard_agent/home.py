"""Switchboard's home folder on this machine ($SWITCHBOARD_HOME, default ~/.switchboard): the agent
side keeps its saved sessions, breaker files and log there; a hub on the same machine keeps its
database, keys and registry there too.

Everything written here through `write_private` is mode 0600 (folder 0700), and replaced atomically.
"""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """The folder named by SWITCHBOARD_HOME (default ~/.switchboard), created 0700 if missing."""
    path = Path(os.environ.get("SWITCHBOARD_HOME") or Path.home() / ".switchboard").expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
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
