"""`switchboard mcp` stopped with SIGTERM (as MCP clients do after closing stdin) still deregisters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hub_topology import REPO
from hub_topology.embedded import Hub

pytestmark = pytest.mark.e2e


def statuses(hub: Hub, token: str) -> dict[str, str]:
    r = httpx.get(
        f"{hub.url}/api/v1/agents",
        params={"include_exited": "true"},
        headers={"Authorization": f"Bearer {token}"},
    )
    return {a["name"]: a["status"] for a in r.json()["agents"]}


def test_sigterm_deregisters_and_exits_promptly(hub: Hub, tmp_path: Path) -> None:
    observer = httpx.post(
        f"{hub.url}/api/v1/sessions",
        json={"name": "observer"},
        headers={"Authorization": f"Bearer {hub.enroll_key}"},
    ).json()["token"]
    env = {
        **os.environ,
        "SWITCHBOARD_URL": hub.url,
        "SWITCHBOARD_ENROLL_KEY": hub.enroll_key,
        "SWITCHBOARD_HOME": str(tmp_path),
        "SWITCHBOARD_NAME": "terminated",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "switchboard_agent.cli", "mcp"],
        stdin=subprocess.PIPE,  # held open: the server is idle, waiting for a client
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        while statuses(hub, observer).get("terminated") != "busy" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert statuses(hub, observer).get("terminated") == "busy"  # registered on start

        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=5)

    assert code == 0, server.stderr.read().decode() if server.stderr else ""
    assert statuses(hub, observer)["terminated"] == "exited"
