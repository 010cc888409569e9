"""Transports that lose the hub's answers (to inbox pulls, to registrations) after the hub has acted on them."""

from __future__ import annotations

import json

import httpx

from switchboard_agent.transport import ReadTimeout, RemoteProtocolError, Request, Response, Transport


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


class LosesRegistrationAnswer:
    """Passes every request to the hub, but loses the hub's answer to the next `lose`
    registrations (POST /sessions) once the hub has committed them, as a read timeout."""

    def __init__(self, hub: Transport, *, lose: int = 1) -> None:
        self.hub, self.lose = hub, lose
        self.registrations: list[dict[str, object]] = []  # the bodies sent

    def handle(self, request: Request) -> Response:
        response = self.hub.handle(request)
        if request.method != "POST" or not request.url.endswith("/api/v1/sessions"):
            return response
        self.registrations.append(json.loads(request.body or b"{}"))
        if self.lose <= 0:
            return response
        self.lose -= 1
        raise ReadTimeout("timed out")  # the hub registered the session; the client never hears

    def close(self) -> None:
        pass
