"""A scripted quality-gate hook: a real HTTP server on a free 127.0.0.1 port."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    """A tiny HTTP server that answers each POST with the next scripted (status, body, delay)."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, Any], float]] = []
        self.received: list[dict[str, Any]] = []
        self.paths: list[str] = []  # the path of each POST, in order
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                length = int(self.headers.get("Content-Length", 0))
                hook.paths.append(self.path)
                hook.received.append(json.loads(self.rfile.read(length)))
                status, body, delay = hook.script.pop(0) if hook.script else (200, {}, 0.0)
                time.sleep(delay)
                payload = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the hub gave up waiting (timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/gate"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, status: int, body: dict[str, Any] | None = None, delay: float = 0.0) -> None:
        self.script.append((status, body or {}, delay))

    def start(self) -> Hook:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
