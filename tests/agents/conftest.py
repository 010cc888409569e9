"""Fixtures for the agent side: every HubClient talks to this test's hub in-process (WSGI)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from switchboard_agent import transport
from switchboard_agent.client import HubClient

HUB_URL = "http://127.0.0.1:8765"


class WSGI:
    """The agent client's transport (`switchboard_agent.transport`) carried by httpx's WSGI
    transport into a WSGI app in this process."""

    def __init__(self, app: Any) -> None:
        self.app = httpx.WSGITransport(app=app)

    def handle(self, request: transport.Request) -> transport.Response:
        sent = httpx.Request(request.method, request.url, headers=request.headers, content=request.body)
        try:
            answer = self.app.handle_request(sent)
        except httpx.TransportError as exc:
            raise transport.RemoteProtocolError(str(exc)) from exc
        return transport.Response(answer.status_code, answer.read())

    def close(self) -> None:
        pass


@pytest.fixture
def inprocess_hub(db: None, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Route every HubClient to the Django app in this process (same database as the test).
    Yields the hub URL the agent side should use."""
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    django_app = get_wsgi_application()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        # As Django's test client does: a request must not close the test's database connection
        # (the test client reconnects the signal after each of its own requests, so do it per call).
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = django_app(environ, start_response)
            try:
                return list(response)
            finally:
                response.close()
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)

    monkeypatch.setenv("SWITCHBOARD_URL", HUB_URL)
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", settings.SWITCHBOARD_ENROLL_KEY)
    monkeypatch.setattr(HubClient, "default_transport", WSGI(app))
    # Hooks and MCP servers run in this process stand for one agent client process, whatever
    # launched the tests: a runner whose ancestors are shells up to PID 1 has no client process
    # at all, and /clear and the MCP server then find nothing to tie the session by.
    from switchboard_agent import hooks, identity

    monkeypatch.setattr(identity, "client_anchor", lambda pid=None: "4242:1")
    monkeypatch.setattr(hooks, "client_anchor", identity.client_anchor)
    yield HUB_URL


@pytest.fixture
def hub_process(tmp_path: Any) -> Iterator[Any]:
    """A real `switchboard serve` process (embedded defaults), for tests of real agent processes."""
    import tempfile
    from pathlib import Path

    from hub_topology.embedded import start_hub

    home = Path(tempfile.mkdtemp(prefix="hub-home-", dir=tmp_path))
    running = start_hub(home)
    yield running
    running.stop()
