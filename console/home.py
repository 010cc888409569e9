"""The hub's home folder: where the SQLite file, keys and secrets live.

Everything secret written here is created with mode 0600 (folder 0700), and created once:
a second call reads what the first one wrote.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


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


SECRET_WRITE_WAIT = 2.0  # seconds a process waits for the secret another one is writing


def read_or_create_secret(name: str, *, nbytes: int = 32) -> str:
    """Return the secret stored in `$SWITCHBOARD_HOME/<name>`, generating it (0600) the first time.

    Processes that start together on one home (a web process and a worker) may each find no file:
    the first to create it (O_EXCL) writes it, and the others wait for what it writes, never
    taking the empty file for the secret."""
    path = home_dir() / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _secret_written(path)
    value = secrets.token_urlsafe(nbytes)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    return value


def _secret_written(path: Path) -> str:
    """The secret in `path`, once the process that created the file has written it."""
    deadline = time.monotonic() + SECRET_WRITE_WAIT
    while not (value := path.read_text(encoding="utf-8").strip()):
        if time.monotonic() >= deadline:
            raise ImproperlyConfigured(
                f"{path} is empty. Delete it and the hub makes a new one (a new secret.key signs "
                "out the console's logins; a new enroll.key must be given to the agents that register)."
            )
        time.sleep(0.01)
    return value
