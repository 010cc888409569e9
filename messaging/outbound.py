"""Where the hub may call out: the one rule for every URL a session or operator gives it to call
(quality-gate hooks now, operator alert webhooks next).

A URL someone else chose must not turn the hub into a probe of its own network: a destination on
a loopback, link-local (cloud metadata at 169.254.169.254), private, shared (100.64/10),
multicast, reserved or unspecified address is refused, unless an operator allowed it in settings
(SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE, or SWITCHBOARD_OUTBOUND_ALLOW for some hosts or networks).

The rule is applied to the addresses the host name resolves to, and the call then connects to
the address that was checked (the URL's name still goes in the Host header and the TLS server
name), so a name that resolves to a public address for the check and to a private one for the
connection (DNS rebinding) cannot slip through. Redirects are never followed, and proxies from
the environment are not used (a proxy would make its own, unchecked, connection).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings

from messaging.errors import Forbidden, Invalid

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_URL_CHARS = 500


@dataclass(frozen=True)
class Destination:
    """A URL the rule allowed, with the address its host resolved to and that the call must use."""

    url: httpx.URL
    address: str


def _allowance() -> tuple[frozenset[str], list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    """The operator's allow-list, split into host names and networks."""
    names: set[str] = set()
    networks = []
    for entry in settings.SWITCHBOARD_OUTBOUND_ALLOW:
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry.lower().rstrip("."))
    return frozenset(names), networks


def address_problem(address: Address) -> str | None:
    """Why the hub may not call `address` on its own judgement, or None when it is public."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_unspecified or address.is_reserved:
        return "a reserved address"
    if address.is_private or not address.is_global:
        return "a private address"
    return None


def _resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to (an IP literal resolves to itself, with no lookup)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def _parse(url: str) -> httpx.URL:
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
        raise Invalid("bad_url", f"A URL is at most {MAX_URL_CHARS} characters.")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise Invalid("bad_url", f"That is not a URL: {exc}.") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise Invalid("bad_url", "A URL the hub calls is http(s)://host[:port]/path.")
    if parsed.userinfo:
        raise Invalid("bad_url", "A URL the hub calls carries no user name or password.")
    return parsed


def destination_check(url: str) -> Destination:
    """Check a URL the hub is asked to call and resolve its host. Raises Invalid for a malformed
    URL or a host that does not resolve, and Forbidden (reason `private_destination`) when any
    address it resolves to is not one the hub may call; otherwise returns the address to use."""
    parsed = _parse(url)
    host = parsed.host.lower().rstrip(".")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = _resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise Invalid("unresolvable_url", f"The host {host!r} does not resolve ({exc}).") from None
    if not addresses:
        raise Invalid("unresolvable_url", f"The host {host!r} does not resolve.")
    if settings.SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE:
        return Destination(url=parsed, address=str(addresses[0]))
    names, networks = _allowance()
    if host in names:
        return Destination(url=parsed, address=str(addresses[0]))
    for address in addresses:  # every one: the connection could go to any of them
        problem = address_problem(address)
        if problem and not any(address in network for network in networks):
            raise Forbidden(
                f"The hub does not call {host} ({address} is {problem}). An operator can allow it "
                "with SWITCHBOARD_OUTBOUND_ALLOW or SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE.",
                reason="private_destination",
            )
    return Destination(url=parsed, address=str(addresses[0]))


def outbound_post(url: str, *, json: Any, timeout: float) -> httpx.Response:
    """POST `json` to `url` if the rule allows it, connecting to the address that was checked and
    following no redirect. Raises what `destination_check` raises (before any connection is
    made), httpx.ConnectError when the host does not resolve now, and httpx's errors of the call."""
    try:
        destination = destination_check(url)
    except Invalid as exc:
        if exc.reason == "unresolvable_url":  # may resolve again later: a transport failure
            raise httpx.ConnectError(exc.detail) from None
        raise
    pinned = destination.url.copy_with(host=destination.address)
    extensions = {"sni_hostname": destination.url.host} if destination.url.scheme == "https" else {}
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        request = client.build_request(
            "POST",
            pinned,
            json=json,
            headers={"Host": destination.url.netloc.decode("ascii")},
            extensions=extensions,
        )
        return client.send(request)


__all__ = ["Destination", "address_problem", "destination_check", "outbound_post"]
