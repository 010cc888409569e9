"""A transport that loses the hub's answers to inbox pulls after the hub has acted on them."""

from __future__ import annotations

import httpx


class LosesAnswers(httpx.BaseTransport):
    """Passes every request to the hub, but replaces the hub's answer to the next `lose` inbox
    pulls with `answer` (a 503 the hub could have sent, or a dropped connection)."""

    def __init__(self, hub: httpx.BaseTransport, *, lose: int, answer: str) -> None:
        self.hub, self.lose, self.answer = hub, lose, answer
        self.pulls: list[httpx.URL] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.hub.handle_request(request)
        if request.method != "GET" or not request.url.path.endswith("/inbox"):
            return response
        self.pulls.append(request.url)
        if self.lose <= 0:
            return response
        self.lose -= 1
        response.read()
        if self.answer == "dropped":
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        return httpx.Response(
            503, json={"error": "unavailable", "detail": "The hub's database is unavailable."}
        )
