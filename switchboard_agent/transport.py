"""How the agent client's requests travel: HTTP/1.1 over the standard library's `http.client`.

A hook is a fresh process per event, so what it imports is paid on every tool call; this module
costs what `http.client` costs. `HubClient` (client.py) builds each request and reads each
answer; a transport only carries them: `HTTPTransport` over kept-alive connections (one pool per
client, safe to share between threads), or a test's stand-in with the same `handle` and `close`.

Timeouts: `connect` bounds opening a connection, `read` each wait for the hub's bytes. Proxies are
the environment's (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`, read as urllib reads
them); redirects are not followed (a 3xx is an answer like any other).

A hub on this machine gets a request only when its listening process runs as this user (or root,
or the account named by `SWITCHBOARD_HUB_USER`): any local account can bind a free loopback port,
and a request carries the enrollment key or a session token. Who holds the other end of a new
connection is read from the kernel's socket table before a byte is written (`listener_check`).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import sys
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


class UntrustedListener(ConnectError):
    """The address is served by a process of another local user: nothing was sent to it."""


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
    if proxy is None and connection.sock is not None:
        try:
            listener_check(connection.sock)
        except UntrustedListener:
            connection.close()
            raise
    return connection


# The kernel's tables of TCP sockets (Linux): each end's addresses, state and owner.
SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"
_MAPPED = b"\0" * 10 + b"\xff\xff"
_ANY = (b"\0" * 16, _MAPPED + b"\0" * 4)  # a socket listening on every address


def listener_check(sock: socket.socket) -> None:
    """Raise UntrustedListener when the other end of `sock`, a new connection, is a process on this
    machine that runs as another user than this one, root and `SWITCHBOARD_HUB_USER`. A server
    elsewhere, or one the socket table cannot tell (no /proc, another network namespace behind a
    port forward), is not judged here."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        peer_host, peer_port = sock.getpeername()[:2]
        own_host, own_port = sock.getsockname()[:2]
        peer, own = _packed(peer_host), _packed(own_host)
    except (OSError, ValueError):
        return
    if not (_is_loopback(peer) or peer == own):
        return  # another machine: its owner is not in this kernel's table
    uid = _holder(peer, peer_port, own, own_port)
    if uid is None or uid in _trusted_uids():
        return
    raise UntrustedListener(
        f"the process serving {peer_host}:{peer_port} runs as another local user (uid {uid}), not as "
        "this one, so it was sent nothing (neither the enrollment key nor a token). If the hub runs "
        "under another account on purpose, name that account in SWITCHBOARD_HUB_USER."
    )


def _trusted_uids() -> set[int]:
    """This user, root (who can read this user's secrets anyway) and SWITCHBOARD_HUB_USER."""
    trusted = {os.geteuid(), 0}
    named = os.environ.get("SWITCHBOARD_HUB_USER", "").strip()
    if named.isdigit():
        trusted.add(int(named))
    elif named:
        import pwd

        with contextlib.suppress(KeyError):  # no such account: it trusts nobody more
            trusted.add(pwd.getpwnam(named).pw_uid)
    return trusted


def _packed(host: str) -> bytes:
    """An IP address as 16 bytes, an IPv4 one as IPv4-mapped IPv6 (as a dual-stack table shows it)."""
    host = host.split("%", 1)[0]
    if ":" in host:
        return socket.inet_pton(socket.AF_INET6, host)
    return _MAPPED + socket.inet_pton(socket.AF_INET, host)


def _is_loopback(address: bytes) -> bool:
    if address.startswith(_MAPPED):
        return address[12] == 127
    return address == b"\0" * 15 + b"\1"


def _table_address(field: str) -> tuple[bytes, int]:
    """`0100007F:1F90` (each 32-bit word in the host's byte order, as Linux prints it) as 16 bytes and a port."""
    hex_address, _, hex_port = field.partition(":")
    raw = bytes.fromhex(hex_address)
    words = (
        b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    )
    return (_MAPPED + words if len(words) == 4 else words), int(hex_port, 16)


def _holder(peer: bytes, peer_port: int, own: bytes, own_port: int) -> int | None:
    """The uid holding the server's end of the connection own→peer: the accepted socket's entry,
    else the socket listening on that port; None when the table shows neither."""
    listening: int | None = None
    for table in SOCKET_TABLES:
        try:
            with open(table, encoding="ascii") as rows:
                next(rows, None)  # the header
                for row in rows:
                    fields = row.split()
                    if len(fields) < 8:
                        continue
                    local, remote = _table_address(fields[1]), _table_address(fields[2])
                    if local == (peer, peer_port) and remote == (own, own_port):
                        return int(fields[7])
                    if fields[3] == _LISTEN and local[1] == peer_port and local[0] in (peer, *_ANY):
                        listening = int(fields[7])
        except (OSError, ValueError):
            continue
    return listening


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
