"""Optional LAN discovery over mDNS (zeroconf), on with SWITCHBOARD_LAN_DISCOVERY=1.

A hub advertises `_switchboard._tcp.local.` with its address, port, name and public key, and
browses for the others; every hub found becomes a LAN peer of this process (asked "do you host X?"
like a configured one). Anyone on the network can advertise, as with any LAN discovery: what a
discovered hub forwards here is still checked by its signature, and an operator can revoke it.
Discovery runs in the `switchboard serve` process (embedded footprint); Celery workers of a
production hub use configured or pinned peers.
"""

from __future__ import annotations

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
_lock = threading.Lock()
_running: Any = None


def mdns_peer_urls() -> list[str]:
    """URLs of hubs discovered on the LAN recently (empty when discovery is off)."""
    now = time.monotonic()
    with _lock:
        return [url for url, seen in _found.values() if now - seen < FORGET_AFTER_SECONDS]


def mdns_peer_keys() -> dict[str, str]:
    """URL → the key a hub discovered on the LAN announced there (a claim: see `lan_peer_key`)."""
    now = time.monotonic()
    with _lock:
        return {url: key for key, (url, seen) in _found.items() if now - seen < FORGET_AFTER_SECONDS}


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
    addresses = [a for a in info.parsed_addresses() if ":" not in a]
    if not addresses:
        return
    url = f"http://{addresses[0]}:{info.port}"
    with _lock:
        _found[key] = (url, time.monotonic())
    log.info("LAN discovery: hub %s at %s", props.get("name", key[:12]), url)


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
