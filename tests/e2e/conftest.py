"""Fixtures that run Switchboard as a real process, the way a user starts it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Hub:
    """A running `switchboard serve` process with its own home folder."""

    url: str
    home: Path
    process: subprocess.Popen[str]
    log: Path

    @property
    def enroll_key(self) -> str:
        return (self.home / "enroll.key").read_text().strip()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode


def _ctrl_c_as_in_a_terminal() -> None:
    """In the hub's process, before it starts: SIGINT back to its default. A runner started in the
    background (`cmd &` in a script) ignores SIGINT and its children inherit that, while a hub
    started from a terminal, which the tests stand for, stops on Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_hub(home: Path, *, extra_env: dict[str, str] | None = None, args: list[str] | None = None) -> Hub:
    """Start `switchboard serve` on a free loopback port and wait (≤ 30 s) until it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SWITCHBOARD_JOBS")}
    env.update({"SWITCHBOARD_HOME": str(home), "PYTHONUNBUFFERED": "1", **(extra_env or {})})
    log = home / "serve.log"
    handle = log.open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "switchboard_agent.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *(args or []),
        ],
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    hub = Hub(url=f"http://127.0.0.1:{port}", home=home, process=process, log=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"switchboard serve exited early:\n{log.read_text()}")
        try:
            if httpx.get(f"{hub.url}/api/openapi.json", timeout=1).status_code == 200:
                return hub
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    hub.stop(signal.SIGKILL)
    raise RuntimeError(f"switchboard serve did not answer within 30 s:\n{log.read_text()}")


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """A fresh hub process on the embedded defaults (SQLite, in-memory layer, in-process jobs)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    running = start_hub(home)
    yield running
    running.stop()
