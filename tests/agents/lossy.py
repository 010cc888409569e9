"""A transport that loses the hub's answers to inbox pulls after the hub has acted on them."""

from __future__ import annotations

import json

import httpx

from switchboard_agent.transport import RemoteProtocolError, Request, Response, Transport


class LosesAnswers:
    """Passes every request to the hub, but replaces the hub's answer to the next `lose` inbox
    pulls with `answer` (a 503 the hub could have sent, or a dropped connection)."""

    def __init__(self, hub: Transport, *, lose: int, answer: str) -> None:
        self.hub, self.lose, self.answer = hub, lose, answer
        self.pulls: list[httpx.URL] = []

    def handle(self, request: Request) -> Response:
        response = self.hub.handle(request)
        url = httpx.URL(request.url)
        if request.method != "GET" or not url.path.endswith("/inbox"):
            return response
        self.pulls.append(url)
        if self.lose <= 0:
            return response
        self.lose -= 1
        if self.answer == "dropped":
            raise RemoteProtocolError("Server disconnected without sending a response.")
        body = {"error": "unavailable", "detail": "The hub's database is unavailable."}
        return Response(503, json.dumps(body).encode())

    def close(self) -> None:
        pass
