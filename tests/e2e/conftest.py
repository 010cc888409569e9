"""Fixtures that run Switchboard as a real process, the way a user starts it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hub_topology import REPO
from hub_topology.embedded import Hub, start_hub
from tests.e2e.console_world import CHROMIUM, CHROMIUM_ARGS, World, world_running


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """A fresh hub process on the embedded defaults (SQLite, in-memory layer, in-process jobs)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    running = start_hub(home)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_running(tmp_path_factory.mktemp("console-e2e")) as running:
        yield running


@pytest.fixture(scope="module")
def browser(world: World) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: SWITCHBOARD_SCREENSHOTS (relative to the repository), else a
    temporary directory."""
    wanted = os.environ.get("SWITCHBOARD_SCREENSHOTS", "").strip()
    where = (REPO / wanted) if wanted else tmp_path
    where.mkdir(parents=True, exist_ok=True)
    return where
