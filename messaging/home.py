"""The hub's secrets in its home folder (`switchboard_agent.home`, shared with the agent side on
the same machine: the folder and its 0600 writes have one implementation there).

Each secret is created once, mode 0600: a second call reads what the first one wrote.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from switchboard_agent.home import home_dir, private_file_beside


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
    written = private_file_beside(path, value + "\n")
    try:
        os.link(written, path)
    except FileExistsError:
        return _secret_in(path)
    finally:
        written.unlink(missing_ok=True)
    return value


def _secret_in(path: Path) -> str:
    """The secret in `path` (FileNotFoundError if there is none yet)."""
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ImproperlyConfigured(
            f"{path} is empty. Delete it and the hub makes a new one (a new secret.key signs "
            "out the console's logins; a new enroll.key must be given to the agents that register)."
        )
    return value
