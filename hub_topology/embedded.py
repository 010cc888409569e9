"""`switchboard serve` as one process, the way a user starts it: the embedded footprint (SQLite,
in-memory layer, in-process jobs) in a home folder of its own, on a free loopback port.

`Hub` here is that one process; the package's own `Hub` is the production topology."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from hub_topology import REPO, free_port


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
    started from a terminal, which the callers stand for, stops on Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_hub(
    home: Path,
    *,
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
    defaults_only: bool = False,
    timeout: float = 60,
    port: int | None = None,
) -> Hub:
    """Start `switchboard serve` on loopback (`port`, else a free one) and wait (≤ `timeout` s)
    until it answers.
    `defaults_only`: none of this process's SWITCHBOARD_* settings reach the hub, only `extra_env`
    on top of the hub's defaults (what a benchmark of the defaults measures)."""
    port = port or free_port()
    dropped = ("DATABASE_URL", "REDIS_URL", "SWITCHBOARD_JOBS")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in dropped and not (defaults_only and k.startswith("SWITCHBOARD_"))
    }
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
    deadline = time.monotonic() + timeout
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
    raise RuntimeError(f"switchboard serve did not answer within {timeout:g} s:\n{log.read_text()}")
