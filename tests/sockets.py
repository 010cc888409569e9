"""Helpers for tests that drive a WebSocket consumer through channels' communicator."""

from __future__ import annotations

import json
import time
from typing import Any

from channels.testing import WebsocketCommunicator


async def closed_within(socket: WebsocketCommunicator, seconds: float) -> tuple[list[dict[str, Any]], int]:
    """The frames received until the server closed the socket, and the close code (fails if it
    is still open after `seconds`)."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the socket was still open after {seconds} s: {frames}"
        output = await socket.receive_output(timeout=left)
        if output["type"] == "websocket.close":
            return frames, output.get("code", 1000)
        if output["type"] == "websocket.send" and output.get("text"):
            frames.append(json.loads(output["text"]))
