"""What a hub does about federation when it starts serving."""

from __future__ import annotations

import logging

from django.conf import settings

from federation.services.identity import hub_identity
from federation.services.registry import registry_refresh, registry_remove_stale, registry_status
from federation.services.relay import live_session_names

log = logging.getLogger(__name__)


def federation_start() -> None:
    """Create the hub key if needed; clean the registry of stale entries and write this hub's own."""
    from federation.services.mdns import mdns_start

    me = hub_identity()
    if settings.SWITCHBOARD_ROLE != "relay" and mdns_start():
        print("  LAN discovery: mDNS on", flush=True)
    removed = registry_remove_stale()
    registry_refresh(live_sessions=live_session_names())
    print(
        f"  hub: {me.name} ({settings.SWITCHBOARD_ROLE}); key {me.public_key}; "
        f"registry: {registry_status()}" + (f" ({removed} stale entries removed)" if removed else ""),
        flush=True,
    )
