"""Fixtures that run Switchboard as a real process, the way a user starts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hub_topology.embedded import Hub, start_hub


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """A fresh hub process on the embedded defaults (SQLite, in-memory layer, in-process jobs)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    running = start_hub(home)
    yield running
    running.stop()
