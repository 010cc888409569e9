"""The one door from the agent side to the hub: `switchboard serve`, `web` and `manage`.

The hub (Django, daphne, Celery...) is the `hub` extra of the distribution, and the agent side
imports none of it: the distribution names the hub's entry in its entry points (pyproject.toml,
group `switchboard.hub`, name `commands`), loaded here only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

DISTRIBUTION = "switchboard"
HUB_ENTRY_GROUP = "switchboard.hub"  # pyproject.toml [project.entry-points."switchboard.hub"]
HUB_COMMANDS = {
    "serve": "run the hub and console in this process",
    "web": "run one production web process: daphne on uvloop, with daphne's options "
    "(`switchboard web --help` lists them; see docs/operations.md)",
    "manage": "run a hub management command with the hub's settings: operator_create NAME, "
    "operator_token NAME, operator_unlock NAME, backup PATH, export_conversation, migrate, ... "
    "(`switchboard manage help` lists them)",
}
EXIT_USAGE = 2


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """`switchboard serve`'s options, in one place for `switchboard --help` and the hub's own parser."""
    parser.add_argument("--host", default=os.environ.get("SWITCHBOARD_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SWITCHBOARD_PORT", "8765")))
    parser.add_argument(
        "--role",
        choices=["hub", "relay"],
        default=os.environ.get("SWITCHBOARD_ROLE", "hub") or "hub",
        help="relay: store sealed messages for other hubs to pull (see docs/federation.md)",
    )


def run_hub_command(command: str, argv: Sequence[str]) -> int:
    """Run a hub command (`serve`, `web`, `manage`) with its own arguments; when the hub's
    dependencies are not installed, say which extra brings them and return a usage error."""
    try:
        return hub_entry()(command, list(argv))
    except ModuleNotFoundError as missing:  # the hub imports its dependencies as it starts
        top = (missing.name or "").partition(".")[0]
        if missing.name != HUB_ENTRY_GROUP and (not top or _installed(top)):
            raise  # a module of an installed package is missing: a bug, not a missing extra
        print(
            f"switchboard {command}: the hub is not installed here ({missing.name or top} is missing); "
            f"install it with: pip install '{DISTRIBUTION}[hub]'",
            file=sys.stderr,
        )
        return EXIT_USAGE


def hub_entry() -> Callable[[str, list[str]], int]:
    """The hub's `run_hub_command(command, argv)`, as the installed distribution names it."""
    from importlib.metadata import entry_points  # costly to import: only the hub's commands need it

    found = entry_points(group=HUB_ENTRY_GROUP, name="commands")
    if not found:
        raise ModuleNotFoundError(f"No {HUB_ENTRY_GROUP} entry point is installed", name=HUB_ENTRY_GROUP)
    entry: Callable[[str, list[str]], int] = next(iter(found)).load()
    return entry


def _installed(top_level: str) -> bool:
    """Whether a top-level module can be found at all (a dependency that is not installed cannot)."""
    import importlib.util

    try:
        return importlib.util.find_spec(top_level) is not None
    except ImportError:
        return False
