"""Bearer authentication for the REST API: session tokens, operator tokens, staff logins."""

from __future__ import annotations

import ipaddress
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuthIsStaff

from messaging.credentials import OPERATOR_PREFIX, hash_token, is_enrollment_key
from messaging.errors import Forbidden, Unauthorized
from messaging.models import OperatorToken
from messaging.principals import Principal, operator_principal, session_principal
from messaging.services.seen import session_seen
from messaging.services.sessions import session_from_token


def principal_from_token(token: str) -> Principal | None:
    """The caller a bearer token stands for, or None. Hash lookup: the token itself is never stored."""
    if token.startswith(OPERATOR_PREFIX):
        row = OperatorToken.objects.filter(token_hash=hash_token(token), revoked=False).first()
        if row is None:
            return None
        OperatorToken.objects.filter(pk=row.pk).update(last_used=timezone.now())
        return operator_principal(row.name)
    session = session_from_token(token)
    if session is None:
        return None
    session_seen(session)  # written within a second, with the others seen meanwhile
    return session_principal(session)


class BearerAuth(HttpBearer):
    """Session or operator token in `Authorization: Bearer ...`."""

    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        return principal_from_token(token)


class AsyncBearerAuth(HttpBearer):
    """The same, for async endpoints (the long-polling inbox)."""

    async def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        return await sync_to_async(principal_from_token)(token)


class StaffLogin(SessionAuthIsStaff):
    """A Django staff login (the console's), acting as an operator. CSRF applies to it, and only
    to it: the check runs once the session cookie has authenticated a staff user, because a cookie
    is the one credential a browser sends on its own. A call without that cookie (no token, a bad
    token) is not cookie-authenticated, so it gets the API's 401 and its hint, whatever its method."""

    def __call__(self, request: HttpRequest) -> Principal | None:
        key = request.COOKIES.get(self.param_name)
        if not key:
            return None
        caller = self.authenticate(request, key)
        if caller is None:
            return None
        super()._get_key(request)  # ninja's CSRF check for cookie auth: HttpError 403 when it fails
        return caller

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        user = super().authenticate(request, key)
        if not user:
            return None
        return operator_principal(request.user.get_username())


class EnrollmentKeyAuth(HttpBearer):
    """The enrollment key, which only registers sessions."""

    def authenticate(self, request: HttpRequest, token: str) -> bool | None:
        return True if is_enrollment_key(token) else None


AUTH: list[Any] = [BearerAuth(), StaffLogin()]

# A request that names a client it came through a proxy for: its peer address is the proxy's.
FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def request_from_this_machine(request: HttpRequest) -> bool:
    """Whether the caller is a process on the hub's own machine, from the connection itself: its
    peer is a loopback address, or the very address it connected to (a local client that used the
    machine's LAN address), or there is no peer address (a Unix socket, which only this machine can
    open). A request that came through a proxy (a forwarding header) is not: behind one, the peer
    is the proxy, and an address in the header (daphne's `--proxy-headers` puts it in the peer's
    place) is whatever the client claimed."""
    meta = request.META
    if any(meta.get(header) for header in FORWARDING_HEADERS):
        return False
    peer = meta.get("REMOTE_ADDR")
    if not peer:
        return True
    address, reached = _ip_address(peer), _ip_address(meta.get("SERVER_NAME", ""))
    if address is None:
        return False
    return address.is_loopback or address == reached


def request_peer_address(request: HttpRequest) -> str:
    """The caller's own IP address as the connection shows it (an IPv4-mapped one as IPv4); ""
    when the request came through a proxy (a forwarding header: the peer is the proxy, the header
    the client's claim) or over a Unix socket."""
    meta = request.META
    if any(meta.get(header) for header in FORWARDING_HEADERS):
        return ""
    address = _ip_address(meta.get("REMOTE_ADDR") or "")
    return str(address) if address is not None else ""


def _ip_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address, an IPv4-mapped IPv6 one as the IPv4 address it maps (a dual-stack
    socket shows IPv4 callers so); None when it is not one."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def principal(request: HttpRequest) -> Principal:
    found = getattr(request, "auth", None)
    if not isinstance(found, Principal):
        raise Unauthorized("Authenticate with a session or operator token.")
    return found


def operator(request: HttpRequest) -> Principal:
    caller = principal(request)
    caller.require_operator()
    return caller


__all__ = [
    "AUTH",
    "AsyncBearerAuth",
    "BearerAuth",
    "EnrollmentKeyAuth",
    "Forbidden",
    "operator",
    "principal",
    "request_from_this_machine",
]
