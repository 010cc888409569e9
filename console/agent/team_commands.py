"""`switchboard tasks ...`: the team task board from the shell, over the teams REST API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def add_task_commands(add: Callable[..., Any]) -> None:
    """Add `tasks` subcommands (wired once the teams API exists)."""
