"""`switchboard web`: one production web process, daphne serving the hub, on uvloop's event loop.

Daphne runs Twisted on an asyncio event loop that it creates when `daphne.server` is imported.
Every request and socket frame goes through that loop: Twisted's reads and writes, the hops to the
request threads and back, the channel layer's Redis calls. uvloop is a drop-in asyncio loop written
in C (Twisted's asyncio reactor accepts it since Twisted 21.7), so the loop has to be chosen
before daphne is imported: `switchboard web` does that, then runs daphne's own command line, with
the hub's application unless one is named.

`SWITCHBOARD_EVENT_LOOP=asyncio` keeps the standard library's loop (to compare, or to debug with
asyncio's debug mode); the default, `uvloop`, falls back to it when uvloop is not installed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import Sequence

log = logging.getLogger(__name__)

APPLICATION = "hub.asgi:application"
EVENT_LOOPS = ("uvloop", "asyncio")
_APPLICATION_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def event_loop_chosen() -> str:
    """Make the asyncio loops created from now on uvloop's, unless SWITCHBOARD_EVENT_LOOP says
    `asyncio` or uvloop is missing; return the name of the loop chosen. Call it before anything
    imports `daphne.server`, which creates daphne's loop on import."""
    wanted = os.environ.get("SWITCHBOARD_EVENT_LOOP", "uvloop").strip().lower() or "uvloop"
    if wanted not in EVENT_LOOPS:
        raise ValueError(f"SWITCHBOARD_EVENT_LOOP must be one of {', '.join(EVENT_LOOPS)}, not {wanted!r}")
    if "daphne.server" in sys.modules:
        raise RuntimeError("daphne.server is already imported: its event loop exists already")
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed: daphne runs on asyncio's own event loop")
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def event_loop_or_refusal(command: str) -> str | None:
    """`event_loop_chosen()`, or None after telling stderr why SWITCHBOARD_EVENT_LOOP is refused
    (the caller exits with 2, a usage error)."""
    try:
        return event_loop_chosen()
    except ValueError as exc:
        print(f"switchboard {command}: {exc}", file=sys.stderr)
        return None


def daphne_arguments(argv: Sequence[str]) -> list[str]:
    """Daphne's arguments: as given, with the hub's ASGI application added at the end (where
    daphne takes it) unless the last argument names one (`module:attribute`) or help is asked."""
    arguments = list(argv)
    if any(a in ("-h", "--help") for a in arguments):
        return arguments
    if not (arguments and _APPLICATION_PATH.fullmatch(arguments[-1])):
        arguments.append(APPLICATION)
    return arguments


def run_web(argv: Sequence[str]) -> int:
    """Run daphne with `argv` (daphne's own options) on the chosen event loop; 2 when
    SWITCHBOARD_EVENT_LOOP names no loop."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    loop_name = event_loop_or_refusal("web")
    if loop_name is None:
        return 2
    print(f"switchboard web: daphne on the {loop_name} event loop", file=sys.stderr, flush=True)
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(daphne_arguments(argv))
    return 0
