"""The README's five-minute tour, run as a newcomer runs it: its shell lines, literally, against a real
`switchboard serve`, and the held message approved in a real headless Chromium in between.

The lines come from README.md itself, so a tour that sends to an agent nobody registered, names a
command that does not exist, or otherwise ends in an error fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub_topology import REPO
from hub_topology.embedded import Hub, start_hub
from tests.e2e.console_world import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.e2e

PASSWORD = "a-newcomers-password"


def tour_blocks() -> list[list[str]]:
    """The shell lines of each ```sh block under the README's "A five-minute tour" heading."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [
        [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        for block in blocks
    ]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    running = start_hub(home)
    try:
        yield running
    finally:
        running.stop()


def _shell(line: str, hub: Hub, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One line in bash, with the virtualenv's bin on PATH as `. .venv/bin/activate` puts it."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SWITCHBOARD_TOKEN")}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        SWITCHBOARD_HOME=str(hub.home),
        SWITCHBOARD_URL=hub.url,
        SWITCHBOARD_OPERATOR_PASSWORD=PASSWORD,  # operator_create asks on a terminal; there is none here
    )
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _approve_in_the_browser(hub: Hub) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(f"{hub.url}/login/")
            page.get_by_label("Username").fill("ada")
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.get_by_role("navigation", name="Console sections").get_by_role("link", name="Holds").click()
            row = page.locator("tr.hold").first
            row.locator("[data-reason-input]").fill("build/ is generated")
            row.get_by_role("button", name="Approve").click()
            page.locator("tr.hold").first.wait_for(state="detached", timeout=10_000)
        finally:
            browser.close()


def test_the_readme_tour_runs_as_written(hub: Hub, tmp_path: Path) -> None:
    blocks = tour_blocks()
    assert len(blocks) == 3, blocks  # talk; hold and operator; after the approval
    assert any("operator_create ada" in line for line in blocks[1])
    message_id = ""
    outputs: list[str] = []
    for number, block in enumerate(blocks):
        if number == 2:
            _approve_in_the_browser(hub)
        for line in block:
            line = line.replace("<message id>", message_id)
            done = _shell(line, hub, tmp_path)
            assert done.returncode == 0, f"{line!r} exited {done.returncode}: {done.stderr}"
            outputs.append(done.stdout)
            found = re.search(r"message id (\S+)", done.stdout)
            message_id = found.group(1) if found else message_id
    everything = "\n".join(outputs)
    assert "Queued for bob" in everything
    assert "HELD for bob" in everything
    assert everything.count("clean up first: rm -rf build/") == 1  # in bob's inbox after the approval
    assert outputs[-1].startswith("read")  # alice's status of the held message, at the end
