"""CPU per API call through the hub's ASGI application, in one process, no server or client around it.

    .venv/bin/python bench/api_stack.py              # 5 rounds of 500 sends and 500 pings (~1 minute)
    .venv/bin/python bench/api_stack.py --smoke      # one short round, to check it works

The calls go straight into `hub.asgi.application` (SQLite in a temporary folder, the in-memory
channel layer, jobs inline), so the figure is what the hub's own code costs per request: the
HTTP stack (Django's handler, ninja's operation), the service and the database, without daphne,
the network or a client. Each round sends `--calls` messages from one session to another and
makes as many authenticated no-op pings; process CPU per call, median over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from common import django_in_process, line, progress


async def _call(app: Any, method: str, path: str, token: str, body: bytes = b"") -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8765),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the client stays: no disconnect during the call
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def _round(app: Any, token: str, to: str, calls: int, tag: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind in ("send", "ping"):
        cpu = time.process_time()
        for i in range(calls):
            if kind == "send":
                body = orjson.dumps({"to": to, "message": f"{tag} {i}"})
                status = await _call(app, "POST", "/api/v1/messages", token, body)
                assert status == 201, status
            else:
                assert await _call(app, "GET", "/api/v1/ping", token) == 200
        out[kind] = (time.process_time() - cpu) / calls * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="one round of 50 calls")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=500, help="sends (and pings) per round")
    args = parser.parse_args()
    rounds, calls = (1, 50) if args.smoke else (args.rounds, args.calls)

    home = Path(tempfile.mkdtemp(prefix="sb-api-stack-"))
    django_in_process(database_url=f"sqlite:///{home / 'hub.sqlite3'}")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import hub.asgi
    from messaging.services.sessions import session_register

    sender = session_register(name="stack-sender")
    receiver = session_register(name="stack-receiver")
    app = hub.asgi.application

    async def run() -> list[dict[str, float]]:
        await _round(app, sender.token, receiver.session.ref, 20, "warm-up")
        results = []
        for r in range(rounds):
            progress(f"round {r + 1}/{rounds}: {calls} sends, {calls} pings")
            results.append(await _round(app, sender.token, receiver.session.ref, calls, f"r{r}"))
            line(
                f"  round {r + 1}: CPU per send / per ping",
                f"{results[-1]['send']:.3f} / {results[-1]['ping']:.3f} ms",
            )
        return results

    results = asyncio.run(run())
    send = statistics.median(r["send"] for r in results)
    ping = statistics.median(r["ping"] for r in results)
    line("CPU per send / per ping (median)", f"{send:.3f} / {ping:.3f} ms")


if __name__ == "__main__":
    main()
