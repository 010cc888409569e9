"""The hub's home folder: where the SQLite file, keys and secrets live.

Everything secret written here is created with mode 0600 (folder 0700), and created once:
a second call reads what the first one wrote.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def home_dir() -> Path:
    """The folder named by SWITCHBOARD_HOME (default ~/.switchboard), created 0700 if missing."""
    path = Path(os.environ.get("SWITCHBOARD_HOME") or Path.home() / ".switchboard").expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, content: str) -> None:
    """Write a file that only its owner can read (0600), replacing any earlier content atomically."""
    written = _written_beside(path, content)
    try:
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)


def read_or_create_secret(name: str, *, nbytes: int = 32) -> str:
    """Return the secret stored in `$SWITCHBOARD_HOME/<name>`, generating it (0600) the first time.

    Processes that start together on one home (a web process and a worker) may each find no file.
    Each then writes a secret of its own beside it and links that into place. A link never
    replaces a file, so one of them wins, the others read the winner's, and nobody can read the
    file before its secret is in it."""
    path = home_dir() / name
    try:
        return _secret_in(path)
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(nbytes)
    written = _written_beside(path, value + "\n")
    try:
        os.link(written, path)
    except FileExistsError:
        return _secret_in(path)
    finally:
        written.unlink(missing_ok=True)
    return value


def _written_beside(path: Path, content: str) -> Path:
    """A new 0600 file in `path`'s folder holding `content`, flushed to disk, for the caller to
    move or link to `path`. Nothing is left behind if writing fails."""
    written = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
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


def _secret_in(path: Path) -> str:
    """The secret in `path` (FileNotFoundError if there is none yet)."""
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ImproperlyConfigured(
            f"{path} is empty. Delete it and the hub makes a new one (a new secret.key signs "
            "out the console's logins; a new enroll.key must be given to the agents that register)."
        )
    return value
