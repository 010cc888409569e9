"""A hub that accepts connections and never answers: a real listener on 127.0.0.1 that takes
every connection, reads nothing back to it, and holds it open until closed."""

from __future__ import annotations

import socket
import threading
from typing import Any


class HungHub:
    def __init__(self) -> None:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="hung-hub", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.getsockname()
        return f"http://{host}:{port}"

    @property
    def accepted(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)  # never read from, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._server.close()

    def __enter__(self) -> HungHub:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
