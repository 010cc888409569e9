"""The shell lines the console shows: a newcomer's first steps, and the hub's management commands
(`switchboard manage ...`) an operator runs, written for the `switchboard` installed beside the
interpreter serving the console."""

from __future__ import annotations

import sys
from pathlib import Path


def _beside_interpreter(name: str) -> Path | None:
    """`name` in the bin folder of the interpreter running this process (the hub's virtualenv)."""
    beside = Path(sys.executable).parent / name
    return beside if beside.is_file() else None


def manage_command(arguments: str) -> str:
    """The shell line that runs a hub management command (`operator_create NAME`, `backup PATH`, ...)
    with the `switchboard` installed beside this interpreter: by its full path when it is there, so
    the line works whether or not the virtualenv is on PATH."""
    program = _beside_interpreter("switchboard") or "switchboard"
    return f"{program} manage {arguments}"


def first_steps(hub_url: str, home: Path) -> list[str]:
    """The shell lines a newcomer runs to see two agents talk on this hub: put the hub's `switchboard`
    on PATH (its virtualenv's activate script, when there is one), name the hub and its home (where
    the CLI finds the enrollment key) when they are not the defaults, register two sessions and
    send from one to the other."""
    from switchboard_agent.config import DEFAULT_URL

    lines = []
    activate = _beside_interpreter("activate")
    if activate:
        lines.append(f". {activate}")
    if hub_url.rstrip("/") != DEFAULT_URL:
        lines.append(f"export SWITCHBOARD_URL={hub_url.rstrip('/')}")
    if home.expanduser().resolve() != (Path.home() / ".switchboard").resolve():
        lines.append(f"export SWITCHBOARD_HOME={home}")
    return [
        *lines,
        "switchboard register --name alice --save alice",
        "switchboard register --name bob --save bob",
        'switchboard --session alice send bob "hello from alice"',
        "switchboard --session bob inbox --ack",
    ]
