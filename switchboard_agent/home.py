"""Switchboard's home folder on this machine ($SWITCHBOARD_HOME, default ~/.switchboard): the agent
side keeps its saved sessions, breaker files and log there; a hub on the same machine keeps its
database, keys and registry there too.

Everything written here through `write_private` is mode 0600 (folder 0700), and replaced atomically.
"""

from __future__ import annotations

import os
import pwd
import shlex
import stat
from pathlib import Path


class UnsafeHome(Exception):
    """SWITCHBOARD_HOME is a folder another local user can write in. Not an OSError: no caller
    reading a file there may take it for a missing file and carry on.

    The one wording of the problem: `str()` is the whole sentence (the CLI's line, `switchboard
    doctor`, the notice a hook shows the user); `problem` says what is wrong with `path`, `fix` the
    commands that fix it."""

    def __init__(self, path: Path, setting: str, problem: str, fix: str) -> None:
        self.path, self.setting, self.problem, self.fix = path, setting, problem, fix
        super().__init__(f"{path} ({setting}) {problem} {fix}")


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
    refuse_unsafe(path, path.stat(), name)  # of the folder a symbolic link names: the one written to
    return path


def read_private(path: Path, name: str = "SWITCHBOARD_HOME") -> str:
    """The text of a file kept in the home (OSError as `open` raises it: a missing file is
    FileNotFoundError); UnsafeHome when another user owns it or group or others can write it. In a
    home others may read (0755), a file they can write is one they can replace the content of."""
    with open(path, encoding="utf-8") as handle:
        refuse_unsafe(path, os.fstat(handle.fileno()), name)
        return handle.read()


def refuse_unsafe(path: Path, found: os.stat_result, name: str) -> None:
    """Raise UnsafeHome when `found` (the stat of folder or file `path`, named by setting `name`)
    belongs to a user other than this one or root, or group or others can write it; the fix
    names the commands for that very folder or file (never a symbolic link to it)."""
    folder = stat.S_ISDIR(found.st_mode)
    mode = stat.S_IMODE(found.st_mode)
    real = shlex.quote(str(path.resolve()))
    kept = "(the hub's address, keys, saved sessions)"
    if found.st_uid not in (os.geteuid(), 0):
        if folder:
            problem = f"belongs to another user (uid {found.st_uid}), who could replace the files kept there {kept}."
            fix = (
                "Use a folder of your own (set SWITCHBOARD_HOME to one), or, if that folder and everything "
                f"in it are yours, run `sudo chown -R {_me()} {real} && chmod 0700 {real}`."
            )
        else:
            problem = f"belongs to another user (uid {found.st_uid}), who could have written what it says."
            fix = (
                f"Remove it if you did not put it there (`sudo rm {real}`); it is written again when needed."
            )
        raise UnsafeHome(path, name, problem, fix)
    if mode & 0o022:
        if folder:
            problem = (
                f"has mode {mode:04o}: other users can write in it and replace the files kept there {kept}."
            )
            fix = f"Run `chmod 0700 {real}`, or use a folder of your own."
        else:
            problem = f"has mode {mode:04o}: other users can write it and change what it says."
            fix = f"Run `chmod 0600 {real}`, and remove it if you do not know its content (`rm {real}`)."
        raise UnsafeHome(path, name, problem, fix)


def _me() -> str:
    """This process's user name (its uid where the system has no name for it)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


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
