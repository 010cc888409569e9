"""Keys this hub holds for other hubs, and where each came from.

What this hub seals a message to, and which hub a request is signed for, is a key from a source
this hub verified, never what an answer over plain HTTP claims:
- channel tier: the machine's registry (entries this user wrote in folders only this user can
  write; `registry_hub_keys` ignores the rest);
- LAN tier: the key configured with the peer's URL (`SWITCHBOARD_LAN_PEERS=url#key`) or a key an
  operator pinned (a pinned Peer row with that URL, or a pinned key an mDNS announcement names);
- relay tier: the destination hub's key only when an operator pinned it (`hub_key_pinned`).
The relay's own key (which requests to the relay are bound to, never sealed to, and its answers
are checked against) is configured (`SWITCHBOARD_RELAY_URL=url#key` or SWITCHBOARD_RELAY_KEY) or,
failing that, read from the relay's `GET /api/v1/federation/hub` and kept from its first use
(`RelayKey`): a different key from that URL later is refused until an operator configures it.
"""

from __future__ import annotations

import logging
import time

import httpx
from django.conf import settings

from federation.errors import RelayKeyChanged, TransientError, Unreachable
from federation.models import Peer, RelayKey
from federation.services.identity import verify_key_from

log = logging.getLogger(__name__)
_relay_keys: dict[str, tuple[float, str]] = {}
RELAY_KEY_CACHE_SECONDS = 3600
AUDIT_REPEAT_SECONDS = 600


def _well_formed(key: str) -> bool:
    try:
        verify_key_from(key)
        return True
    except ValueError:
        return False


def hub_key_pinned(public_key: str) -> bool:
    """Whether an operator pinned this hub key (and has not revoked it)."""
    return Peer.objects.filter(public_key=public_key, pinned=True, revoked=False).exists()


def lan_peer_key(url: str) -> str | None:
    """The key this hub holds for the LAN peer at `url` from a verified source, or None."""
    url = url.rstrip("/")
    configured = settings.SWITCHBOARD_LAN_PEER_KEYS.get(url, "")
    if configured:
        return configured if _well_formed(configured) else None
    pinned = (
        Peer.objects.filter(url=url, pinned=True, revoked=False).values_list("public_key", flat=True).first()
    )
    if pinned:
        return pinned
    from federation.services.mdns import mdns_peer_keys

    announced = mdns_peer_keys().get(url)
    if announced and hub_key_pinned(announced):
        return announced
    return None


def hub_urls_verified(hub_key: str) -> list[str]:
    """The addresses this hub holds for the hub holding `hub_key` from a verified source: its
    registry entry (channel), a configured LAN peer (`url#key`), an operator's pin with a URL.
    What a message, a request or an mDNS announcement claims is never one: signing with a key
    proves the key, not an address, and anyone on the network can announce any key anywhere."""
    from federation.services.registry import registry_hub_urls

    urls: list[str] = []
    registered = registry_hub_urls().get(hub_key)
    if registered:
        urls.append(registered)
    urls += [url for url, key in settings.SWITCHBOARD_LAN_PEER_KEYS.items() if key == hub_key]
    urls += (
        Peer.objects.filter(public_key=hub_key, pinned=True, revoked=False)
        .exclude(url="")
        .values_list("url", flat=True)
    )
    return list(dict.fromkeys(u.rstrip("/") for u in urls if u))


def relay_key() -> str:
    """The relay's key, for binding requests to it: configured, or read from the relay (cached)."""
    relay = settings.SWITCHBOARD_RELAY_URL
    if settings.SWITCHBOARD_RELAY_KEY:
        return settings.SWITCHBOARD_RELAY_KEY
    hit = _relay_keys.get(relay)
    if hit and hit[0] > time.monotonic():
        return hit[1]
    from federation.transport import answer_read, hub_json

    try:
        with httpx.stream(
            "GET", relay + "/api/v1/federation/hub", timeout=settings.SWITCHBOARD_FEDERATION_TIMEOUT
        ) as response:
            answer = hub_json(answer_read(response))
    except httpx.ConnectError as exc:
        raise Unreachable(f"the relay did not answer: {exc}"[:300]) from exc
    except (httpx.HTTPError, ValueError) as exc:
        raise TransientError(f"the relay did not say its key: {exc}"[:300]) from exc
    key = answer.get("public_key") if isinstance(answer, dict) else None
    if not isinstance(key, str) or not _well_formed(key):
        raise TransientError("the relay did not say its key")
    kept, _ = RelayKey.objects.get_or_create(url=relay.rstrip("/"), defaults={"public_key": key})
    if kept.public_key != key:
        _audit_at_most_every(
            "federation.relay_key_changed",
            target=relay[:200],
            detail={"kept": kept.public_key, "said": key},
        )
        raise RelayKeyChanged(
            f"the relay at {relay} now says its key is {key[:16]}…, not {kept.public_key[:16]}…, the "
            "key it had when this hub first used it; if the relay's key really changed, configure it "
            "(SWITCHBOARD_RELAY_URL=url#key)"
        )
    _relay_keys[relay] = (time.monotonic() + RELAY_KEY_CACHE_SECONDS, key)
    return key


def relay_key_forget() -> None:
    """Drop the cached relay keys: the next `relay_key` reads the key from the relay again (and
    checks it against the one kept from first use)."""
    _relay_keys.clear()


def answer_refused_record(
    *, dest_key: str, url: str, path: str, status: int, problem: str, **_: object
) -> None:
    """Log an answer `hub_call` refused (not signed by `dest_key` for the request it answers), and
    audit it as `federation.answer_refused` (`_audit_at_most_every`)."""
    log.warning("answer from %s%s (HTTP %s) refused: %s", url, path, status, problem)
    _audit_at_most_every(
        "federation.answer_refused",
        target=dest_key,
        detail={"url": url[:200], "path": path[:200], "status": status, "why": problem[:200]},
    )


def lease_unverified_record(*, relay: str, hub_key: str, agent: str, problem: str) -> None:
    """Log a relay answer naming a hub for `agent` that this hub did not believe (no statement
    of that hub's for the name, this relay, now: `relay.relay_lease_entry_problem`), and audit
    it as `federation.lease_unverified` for the relay (`_audit_at_most_every`)."""
    log.warning("relay %s named hub key %s for %r; not believed: %s", relay, hub_key[:16], agent, problem)
    _audit_at_most_every(
        "federation.lease_unverified",
        target=relay[:200],
        detail={"agent": agent[:200], "hub_key": hub_key[:64], "why": problem[:200]},
    )


def receipt_rejected_record(*, relay: str, hub_key: str, problem: str) -> None:
    """Log a receipt batch pulled from `relay` that this hub did not believe (`hub_key`: the hub it
    names, its own word; `receipt_batch_problem` says why), and audit it as
    `federation.receipt_rejected` for the relay (`_audit_at_most_every`): any key may store batches
    there for this hub, as many as it likes, so the operators get the fact, not one row per batch."""
    log.info("receipt batch from relay %s naming hub key %s refused: %s", relay, hub_key[:16], problem)
    _audit_at_most_every(
        "federation.receipt_rejected",
        target=relay[:200],
        detail={"hub_key": hub_key[:64], "why": problem[:200]},
    )


def _audit_at_most_every(kind: str, *, target: str, detail: dict[str, object]) -> None:
    """Audit `kind` for `target` once per AUDIT_REPEAT_SECONDS: what refuses a peer (or the relay)
    recurs at every retry, every few seconds, and its operators need the fact, not one row per try."""
    from datetime import timedelta

    from django.utils import timezone

    from messaging.models import AuditEvent
    from messaging.services.audit import audit_event

    since = timezone.now() - timedelta(seconds=AUDIT_REPEAT_SECONDS)
    if AuditEvent.objects.filter(kind=kind, target=target, at__gte=since).exists():
        return
    audit_event(kind, actor="hub", target=target, detail=detail)


def keys_refused_recently(*, days: int = 7, limit: int = 20) -> list[dict[str, object]]:
    """Destination keys this hub refused to seal to lately and that no operator pinned since (the
    relay named them for an agent, or a LAN answer did), newest first: for the peers list, so an
    operator sees a lease that moved to another key and can check and pin it."""
    from datetime import timedelta

    from django.utils import timezone

    from federation.services.identity import key_fingerprint
    from messaging.models import AuditEvent

    since = timezone.now() - timedelta(days=days)
    rows: dict[str, dict[str, object]] = {}
    for event in AuditEvent.objects.filter(kind="federation.key_unverified", at__gte=since).order_by("-id")[
        :500
    ]:
        if event.target in rows:
            continue
        rows[event.target] = {
            "public_key": event.target,
            "fingerprint": key_fingerprint(event.target),
            "tier": event.detail.get("tier", ""),
            "agent": event.detail.get("agent", ""),
            "at": event.at.isoformat(),
        }
    pinned = set(
        Peer.objects.filter(public_key__in=list(rows), pinned=True).values_list("public_key", flat=True)
    )
    return [row for key, row in rows.items() if key not in pinned][:limit]
