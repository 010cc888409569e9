"""Optional LAN discovery over mDNS (zeroconf), on with SWITCHBOARD_LAN_DISCOVERY=1.

A hub advertises `_switchboard._tcp.local.` with its address, port, name and public key, and
browses for the others; every hub found becomes a LAN peer of this process (asked "do you host X?"
like a configured one) once an operator pinned its key. Anyone on the network can advertise any
key at any address, as with any LAN discovery: what a discovered hub forwards here is still
checked by its signature, an address no LAN hub can have (loopback, link-local, ...) is ignored,
and a key announced at two addresses (or two keys at one) is used at neither until the
disagreement is FORGET_AFTER_SECONDS old.
Discovery runs in the `switchboard serve` process (embedded footprint); Celery workers of a
production hub use configured or pinned peers.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from federation.services.identity import hub_identity

log = logging.getLogger(__name__)
SERVICE = "_switchboard._tcp.local."
FORGET_AFTER_SECONDS = 600
_found: dict[str, tuple[str, float]] = {}  # hub key -> (url, last seen)
# A hub key announced at two addresses, or an address announced for two keys -> when they last
# disagreed. Announcements are anyone's word: while they disagree, neither is used.
_conflicts: dict[str, float] = {}
_lock = threading.Lock()
_running: Any = None


def _fresh(seen: float, now: float) -> bool:
    return now - seen < FORGET_AFTER_SECONDS


def _usable(now: float) -> dict[str, str]:
    """Key → URL of what was announced recently and not disputed (call with `_lock` held)."""
    return {
        key: url
        for key, (url, seen) in _found.items()
        if _fresh(seen, now)
        and not _fresh(_conflicts.get(key, -FORGET_AFTER_SECONDS), now)
        and not _fresh(_conflicts.get(url, -FORGET_AFTER_SECONDS), now)
    }


def mdns_peer_urls() -> list[str]:
    """URLs of hubs discovered on the LAN recently (empty when discovery is off)."""
    now = time.monotonic()
    with _lock:
        return list(_usable(now).values())


def mdns_peer_keys() -> dict[str, str]:
    """URL → the key a hub discovered on the LAN announced there (a claim: see `lan_peer_key`)."""
    now = time.monotonic()
    with _lock:
        return {url: key for key, url in _usable(now).items()}


def _lan_address(text: str) -> bool:
    """Whether a hub on the LAN can be at `text` (an IPv4 address): not this machine's loopback,
    link-local (cloud metadata), multicast, unspecified or reserved, where an announcement would
    only point this hub at something that is no hub."""
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return not (
        address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    )


def _announced(key: str, urls: list[str], now: float) -> None:
    """Record that `key` was announced at `urls` (one per address the announcement lists, in its
    order): at the one already known for it when it is still among them (a hub on several
    networks lists them all, in no fixed order), else at the first. A fresh announcement that
    disagrees (the key at another address, or another key at this one) disputes both (call with
    `_lock` held)."""
    known = _found.get(key)
    url = known[0] if known is not None and known[0] in urls else urls[0]
    if known is not None and known[0] != url and _fresh(known[1], now):
        _conflicts[key] = now
        log.warning(
            "LAN discovery: hub key %s announced at %s and at %s; using neither", key[:12], known[0], url
        )
    if any(u == url and k != key and _fresh(seen, now) for k, (u, seen) in _found.items()):
        _conflicts[url] = now
        log.warning("LAN discovery: two hub keys announced at %s; using neither", url)
    _found[key] = (url, now)


def _on_change(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
    from zeroconf import ServiceStateChange

    if state_change is ServiceStateChange.Removed:
        return
    info = zeroconf.get_service_info(service_type, name, timeout=2000)
    if info is None:
        return
    props = {
        k.decode(): (v.decode() if isinstance(v, bytes) else "") for k, v in (info.properties or {}).items()
    }
    key = props.get("key", "")
    if not key or key == hub_identity().public_key:
        return
    addresses = [a for a in info.parsed_addresses() if ":" not in a and _lan_address(a)]
    if not addresses:
        return
    with _lock:
        _announced(key, [f"http://{a}:{info.port}" for a in addresses], time.monotonic())
    log.info("LAN discovery: hub %s at %s", props.get("name", key[:12]), ", ".join(addresses))


def mdns_start() -> bool:
    """Advertise this hub and browse for others (once per process). False when off or unavailable."""
    global _running
    if not settings.SWITCHBOARD_LAN_DISCOVERY or _running is not None or not settings.SWITCHBOARD_PUBLIC_URL:
        return False
    try:
        from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceInfo, Zeroconf
    except ImportError:
        log.warning("SWITCHBOARD_LAN_DISCOVERY is on but zeroconf is not installed (pip install zeroconf)")
        return False
    public = urlsplit(settings.SWITCHBOARD_PUBLIC_URL)
    host, port = public.hostname or "", public.port or 80
    specific = host not in ("", "0.0.0.0", "127.0.0.1", "localhost") and ":" not in host
    if specific:
        zc = Zeroconf(interfaces=[host], ip_version=IPVersion.V4Only)
        addresses = [socket.inet_aton(host)]
    else:
        import ifaddr

        zc = Zeroconf(interfaces=InterfaceChoice.All, ip_version=IPVersion.V4Only)
        addresses = [
            socket.inet_aton(ip.ip)
            for adapter in ifaddr.get_adapters()
            for ip in adapter.ips
            if isinstance(ip.ip, str) and not ip.ip.startswith("127.")
        ]
    me = hub_identity()
    info = ServiceInfo(
        SERVICE,
        f"{me.fingerprint}.{SERVICE}",
        addresses=addresses,
        port=port,
        properties={"key": me.public_key, "name": me.name[:60]},
        server=f"switchboard-{me.fingerprint}.local.",
    )
    zc.register_service(info)
    browser = ServiceBrowser(zc, SERVICE, handlers=[_on_change])
    _running = (zc, browser, info)
    log.info("LAN discovery on (mDNS %s)", SERVICE)
    return True


def mdns_stop() -> None:
    global _running
    if _running is None:
        return
    zc, _browser, info = _running
    try:
        zc.unregister_service(info)
    finally:
        zc.close()
        _running = None
