"""Discovery across hubs: the agents other hubs host, with the tier each is reached on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from federation.errors import PermanentError, TransientError
from federation.services.keys import lan_peer_key, relay_key
from federation.services.lookups import LookupCache
from federation.services.registry import registry_entries
from federation.services.relay import relay_lease_entry_problem
from federation.services.signatures import lease_statement_seconds_left
from federation.transport import hub_call
from messaging.names import normalize_name

# The agents each LAN peer and the relay list, kept as `federation.services.lookups` says.
_list_cache: LookupCache[str, list[dict[str, Any]]] = LookupCache()


def _remote_row(*, tier: str, hub: str, id: str, name: str, ref: str, cwd: str = "") -> dict[str, Any]:
    return {
        "id": id,
        "name": name,
        "ref": ref,
        "cwd": cwd,
        "kind": "remote",
        "status": "idle",
        "permission_mode": "default",
        "inbound_policy": None,
        "peer_address": "",
        "addressable": True,
        "last_seen": None,
        "tier": tier,
        "hub": hub,
    }


def _cached_call(
    key: str,
    url: str,
    path: str,
    dest_key: Callable[[], str | None],
    keep: Callable[[dict[str, Any], str], bool] = lambda row, dest: True,
    good_for: Callable[[list[dict[str, Any]]], float | None] = lambda rows: None,
) -> list[dict[str, Any]]:
    """The agents the hub (or relay) at `url` lists, those `keep` (given the key answering) takes.
    Its own answer (signed by the key held for it: a 2xx, or a 4xx refusal) is remembered as its
    word, for no longer than `good_for` says of the rows kept; no answer (no key to ask with,
    unreachable, 5xx, or one it did not sign) only briefly (`federation.services.lookups`)."""
    hit, cached = _list_cache.get(key)
    if hit:
        return cached or []
    try:
        dest = dest_key()
        if not dest:
            _list_cache.unanswered(key, [])
            return []
        answer = hub_call("GET", url, path, dest_key=dest, timeout=1.5) or {}
    except TransientError:
        _list_cache.unanswered(key, [])
        return []
    except PermanentError:
        answer = {}
    listed = answer.get("agents") if isinstance(answer, dict) else None
    hub_name = answer.get("hub_name", "") if isinstance(answer, dict) else ""
    rows = [
        dict(r, hub=r.get("hub", hub_name))
        for r in (listed if isinstance(listed, list) else [])
        if isinstance(r, dict) and keep(r, dest)
    ]
    _list_cache.answered(key, rows, good_for=good_for(rows))
    return rows


def remote_agents_list(*, name: str | None = None) -> list[dict[str, Any]]:
    """Agents live in other hubs: channel (this machine's registry), LAN peers, relay leases."""
    from federation.services.forwarding import lan_peer_urls

    rows = [
        _remote_row(tier="channel", hub=e.hub_name, id=e.session_id, name=e.name, ref=e.ref, cwd=e.cwd)
        for e in registry_entries()
    ]
    for url in lan_peer_urls():
        for r in _cached_call(f"lan:{url}", url, "/federation/agents", lambda u=url: lan_peer_key(u)):
            rows.append(
                _remote_row(
                    tier="lan",
                    hub=str(r.get("hub", "")),
                    id=str(r.get("id", "")),
                    name=str(r.get("name", "")),
                    ref=str(r.get("ref", "")),
                )
            )
    if settings.SWITCHBOARD_RELAY_URL:
        # Only names whose hub signed its lease for this relay: what a sender checks before routing.
        relay = settings.SWITCHBOARD_RELAY_URL
        for r in _cached_call(
            "relay", relay, "/relay/agents", relay_key, _relay_row_believed, _statements_good_for
        ):
            rows.append(_remote_row(tier="relay", hub="", id="", name=str(r.get("name", "")), ref=""))
    if name:
        key = normalize_name(name)
        rows = [r for r in rows if normalize_name(r["name"]).startswith(key)]
    return rows


def _relay_row_believed(row: dict[str, Any], relay: str) -> bool:
    """A relay's row is listed only as far as the hub it names signed it (`relay_lease_entry_problem`)."""
    return relay_lease_entry_problem(row, asked=str(row.get("name", "")), relay_key=relay) is None


def _statements_good_for(rows: list[dict[str, Any]]) -> float | None:
    """How long the relay rows listed stay believed: until the first of their statements ends."""
    now = time.time()
    return min((lease_statement_seconds_left(r["statement"], now=now) for r in rows), default=None)


def discovery_cache_clear() -> None:
    _list_cache.clear()
