"""The hub's home folder: where the SQLite file, keys and secrets live.

Everything secret written here is created with mode 0600 (folder 0700), and created once:
a second call reads what the first one wrote.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def home_dir() -> Path:
    """The folder named by SWITCHBOARD_HOME (default ~/.switchboard), created 0700 if missing."""
    path = Path(os.environ.get("SWITCHBOARD_HOME") or Path.home() / ".switchboard").expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, content: str) -> None:
    """Write a file that only its owner can read (0600), replacing any earlier content atomically."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_or_create_secret(name: str, *, nbytes: int = 32) -> str:
    """Return the secret stored in `$SWITCHBOARD_HOME/<name>`, generating it (0600) the first time."""
    path = home_dir() / name
    try:
        value = path.read_text(encoding="utf-8").strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(nbytes)
    try:
        # O_EXCL: when two processes race, the first writer wins and the second reads its value.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    return value
