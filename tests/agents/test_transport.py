"""The agent client's HTTP transport (`switchboard_agent.transport`) against real sockets: kept-alive
connections are reused, one the server closed is not, and the environment's proxy is used."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from switchboard_agent.client import HubClient, HubUnreachable


class Recorder(BaseHTTPRequestHandler):
    """Answers `{"ok": true}` and records each request (its client port, target and headers)."""

    protocol_version = "HTTP/1.1"
    close_after_answer = False

    def do_GET(self) -> None:
        server: Any = self.server
        server.seen.append((self.client_address[1], self.path, dict(self.headers)))
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.close_after_answer:  # drops an idle keep-alive connection without saying so
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


class Closing(Recorder):
    close_after_answer = True


def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[tuple[str, list[Any]]]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server.seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def hub() -> Iterator[tuple[str, list[Any]]]:
    yield from serve(Recorder)


@pytest.fixture
def closing_hub() -> Iterator[tuple[str, list[Any]]]:
    yield from serve(Closing)


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_requests_share_a_kept_alive_connection(hub: tuple[str, list[Any]]) -> None:
    url, seen = hub
    with HubClient(url, "t" * 40) as client:
        assert client.me() == {"ok": True}
        assert client.call("GET", "agents", params={"name": "a b", "all": None}) == {"ok": True}
    assert len({connection for connection, _, _ in seen}) == 1
    assert [path for _, path, _ in seen] == ["/api/v1/sessions/me", "/api/v1/agents?name=a+b"]
    assert {headers["Authorization"] for _, _, headers in seen} == {"Bearer " + "t" * 40}


def test_a_connection_the_hub_closed_is_not_reused(closing_hub: tuple[str, list[Any]]) -> None:
    url, seen = closing_hub
    with HubClient(url, "t" * 40) as client:
        client.me()
        time.sleep(0.2)  # the hub has closed that connection by now
        assert client.me() == {"ok": True}
    assert len({connection for connection, _, _ in seen}) == 2


def test_the_environments_proxy_carries_requests_unless_no_proxy_names_the_host(
    hub: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, seen = hub
    monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", "http://user:pw@"))
    with HubClient("http://hub.invalid:8765", "t" * 40) as client:
        assert client.me() == {"ok": True}  # the proxy answered for the hub
    _, target, headers = seen[0]
    assert target == "http://hub.invalid:8765/api/v1/sessions/me"
    assert headers["Proxy-Authorization"] == "Basic dXNlcjpwdw=="  # user:pw

    monkeypatch.setenv("NO_PROXY", "hub.invalid")
    with HubClient("http://hub.invalid:8765", "t" * 40, timeout=2) as client, pytest.raises(HubUnreachable):
        client.me()  # straight to a host that does not exist
