"""How the agent client's requests travel: HTTP/1.1 over the standard library's `http.client`.

A hook is a fresh process per event, so what it imports is paid on every tool call; this module
costs what `http.client` costs. `HubClient` (client.py) builds each request and reads each
answer; a transport only carries them: `HTTPTransport` over kept-alive connections (one pool per
client, safe to share between threads), or a test's stand-in with the same `handle` and `close`.

Timeouts: `connect` bounds opening a connection, `read` each wait for the hub's bytes. Proxies are
the environment's (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`, read as urllib reads
them); redirects are not followed (a 3xx is an answer like any other).
"""

from __future__ import annotations

import http.client
import os
import select
import threading
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import SplitResult, unquote, urlsplit


@dataclass(frozen=True)
class Timeout:
    """Seconds to wait for each read of an answer, and to open a connection."""

    read: float
    connect: float


@dataclass(frozen=True)
class Request:
    method: str
    url: str  # absolute, with its query string
    headers: dict[str, str]
    body: bytes | None
    timeout: Timeout


@dataclass(frozen=True)
class Response:
    status: int
    content: bytes


class TransportError(Exception):
    """No answer came back: the hub could not be reached, or the exchange broke on the way."""


class ConnectError(TransportError):
    pass


class ReadError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


class TimeoutException(TransportError):
    pass


class ConnectTimeout(TimeoutException):
    pass


class ReadTimeout(TimeoutException):
    pass


class Transport(Protocol):
    def handle(self, request: Request) -> Response: ...

    def close(self) -> None: ...


Origin = tuple[str, str, int | None]


class HTTPTransport:
    """Requests over kept-alive HTTP/1.1 connections. A connection goes back to the pool only
    once its answer was read in full, and one the server closed meanwhile is never reused."""

    def __init__(self) -> None:
        self._idle: dict[Origin, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def handle(self, request: Request) -> Response:
        parts = urlsplit(request.url)
        origin = (parts.scheme, parts.hostname or "", parts.port)
        connection = self._take(origin)
        if connection is None:
            connection = _open(parts, request.timeout)
        try:
            assert connection.sock is not None
            connection.sock.settimeout(request.timeout.read)
            target = request.url if isinstance(connection, _Forwarding) else _path(parts)
            connection.request(request.method, target, body=request.body, headers=request.headers)
            answer = connection.getresponse()
            response = Response(answer.status, answer.read())
        except BaseException as exc:
            connection.close()
            if isinstance(exc, TimeoutError):
                raise ReadTimeout(str(exc) or "timed out") from exc
            if isinstance(exc, http.client.HTTPException):
                raise RemoteProtocolError(str(exc) or type(exc).__name__) from exc
            if isinstance(exc, OSError):
                raise ReadError(str(exc)) from exc
            raise
        if answer.will_close:
            connection.close()
        else:
            with self._lock:
                self._idle.setdefault(origin, []).append(connection)
        return response

    def _take(self, origin: Origin) -> http.client.HTTPConnection | None:
        """An idle connection to `origin` that is still open, or None."""
        while True:
            with self._lock:
                pool = self._idle.get(origin)
                if not pool:
                    return None
                connection = pool.pop()
            sock = connection.sock
            # Readable while idle means the server closed it (or broke the protocol): discard.
            if sock is not None and not select.select([sock], [], [], 0)[0]:
                return connection
            connection.close()

    def close(self) -> None:
        with self._lock:
            pools, self._idle = self._idle, {}
        for pool in pools.values():
            for connection in pool:
                connection.close()


def _open(parts: SplitResult, timeout: Timeout) -> http.client.HTTPConnection:
    """A new connection to the URL's origin (through the environment's proxy, if it names one)."""
    host, port = parts.hostname or "", parts.port
    proxy = _proxy_for(parts)
    proxy_headers = _proxy_auth(proxy) if proxy else {}
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        import ssl

        context = ssl.create_default_context()
        if proxy is None:
            connection = http.client.HTTPSConnection(host, port, timeout=timeout.connect, context=context)
        else:
            connection = http.client.HTTPSConnection(
                proxy.hostname or "", proxy.port, timeout=timeout.connect, context=context
            )
            connection.set_tunnel(host, port, headers=proxy_headers)
    elif proxy is None:
        connection = http.client.HTTPConnection(host, port, timeout=timeout.connect)
    else:
        connection = _Forwarding(proxy.hostname or "", proxy.port, proxy_headers, timeout=timeout.connect)
    try:
        connection.connect()
    except TimeoutError as exc:
        connection.close()
        raise ConnectTimeout(str(exc) or "timed out") from exc
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise ConnectError(str(exc) or type(exc).__name__) from exc
    return connection


class _Forwarding(http.client.HTTPConnection):
    """A plain-HTTP connection to a proxy: requests name the full URL and carry its credentials."""

    def __init__(self, host: str, port: int | None, proxy_headers: dict[str, str], *, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.proxy_headers = proxy_headers

    def putrequest(
        self, method: str, url: str, skip_host: bool = False, skip_accept_encoding: bool = False
    ) -> None:
        super().putrequest(method, url, skip_host=skip_host, skip_accept_encoding=skip_accept_encoding)
        for name, value in self.proxy_headers.items():
            self.putheader(name, value)


def _path(parts: SplitResult) -> str:
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _proxy_for(parts: SplitResult) -> SplitResult | None:
    """The proxy the environment names for this URL, or None. urllib (costly to import) is
    imported only when some `*_proxy` variable is set."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return None
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    if urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return None
    url = proxies.get(parts.scheme) or proxies.get("all")
    if not url:
        return None
    return urlsplit(url if "://" in url else f"http://{url}")


def _proxy_auth(proxy: SplitResult) -> dict[str, str]:
    if not proxy.username:
        return {}
    import base64

    pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    return {"Proxy-Authorization": f"Basic {base64.b64encode(pair).decode()}"}
