"""Peer hubs, known by their Ed25519 public keys, and how far this hub vouches for each.

A key is vouched for by this machine's registry (the channel tier), by an operator's pin (the
tier the operator gave, channel or LAN) or by the LAN peers configured in SWITCHBOARD_LAN_PEERS;
the relay carries messages on the relay tier. Any other key is unknown: with
SWITCHBOARD_PEER_TOFU on (the default) its first contact is recorded and its messages are held
for an operator (`unknown_peer`, escalate=required) until one pins it; with it off, it is refused.
An operator can revoke a peer, after which its messages are refused or held for a human."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from federation.errors import PeerRevoked, PeerUnknown
from federation.models import FederationTier, Peer, RevocationMode
from federation.services.identity import verify_key_from
from messaging.errors import Invalid, NotFound, SwitchboardError
from messaging.hold_reasons import REVOKED_PEER_HOLD, UNKNOWN_PEER_HOLD
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.services.events import announce


@dataclass(frozen=True)
class PeerStanding:
    """How this hub treats a calling hub right now."""

    peer: Peer
    hold: bool  # revoked with mode "hold": accept, but hold with escalate=required
    tier: str = ""  # the tier a source vouches for the key on ("" = nobody, first use)

    @property
    def vouched(self) -> bool:
        """This hub vouches for the key now: a source vouches for it (`peer_vouched_tier`) and no
        operator revoked it. The one test of "vouched" for a hub's messages (trust, priority,
        files, hub name) and for what it may read (the agent directory)."""
        return bool(self.tier) and not self.hold

    @property
    def hold_reason(self) -> str:
        """Why its messages wait for an operator ("" when they need not)."""
        if self.hold:
            return REVOKED_PEER_HOLD
        return "" if self.tier else UNKNOWN_PEER_HOLD


def peer_summary(peer: Peer) -> dict[str, object]:
    return {
        "id": peer.pk,
        "name": peer.name,
        "public_key": peer.public_key,
        "url": peer.url,
        "tier": peer.tier,
        "pinned": peer.pinned,
        "revoked": peer.revoked,
        "revocation_mode": peer.revocation_mode,
        "first_seen": peer.first_seen.isoformat() if peer.first_seen else None,
        "last_seen": peer.last_seen.isoformat() if peer.last_seen else None,
    }


def peer_vouched_tier(public_key: str) -> str:
    """The tier this hub vouches for `public_key` on, from facts it holds (never from a caller):
    `channel` for a key in this machine's registry, the tier an operator pinned it with (`channel`,
    else `lan`), `lan` for a key configured with a LAN peer (`SWITCHBOARD_LAN_PEERS=url#key`);
    "" for a key nobody vouched for."""
    from federation.services.registry import registry_hub_keys

    if public_key in registry_hub_keys().values():
        return FederationTier.CHANNEL
    pinned = (
        Peer.objects.filter(public_key=public_key, pinned=True, revoked=False)
        .values_list("tier", flat=True)
        .first()
    )
    if pinned is not None:
        return FederationTier.CHANNEL if pinned == FederationTier.CHANNEL else FederationTier.LAN
    if public_key in settings.SWITCHBOARD_LAN_PEER_KEYS.values():
        return FederationTier.LAN
    return ""


def peer_refusal(public_key: str) -> SwitchboardError | None:
    """Why this hub refuses calls from `public_key` outright (None when it does not): an operator
    revoked it with mode `refuse`, or nobody vouched for it (`peer_vouched_tier`) while
    SWITCHBOARD_PEER_TOFU is off. A key revoked with mode `hold` is not refused: held."""
    row = Peer.objects.filter(public_key=public_key).values_list("revoked", "revocation_mode", "name").first()
    if row is not None and row[0]:
        if row[1] == RevocationMode.HOLD:
            return None
        return PeerRevoked(f"An operator of this hub revoked the hub {row[2] or public_key[:12]}.")
    if not settings.SWITCHBOARD_PEER_TOFU and not peer_vouched_tier(public_key):
        return PeerUnknown(
            "This hub accepts only hubs it vouches for (its registry, its configured LAN peers, keys "
            "an operator pinned); ask its operator to pin your key."
        )
    return None


def peer_seen(*, public_key: str, name: str = "", url: str = "", tier: str) -> PeerStanding:
    """Record contact from the hub holding `public_key` and say how this hub treats it.

    A key nobody vouched for (`peer_vouched_tier`) is recorded on first use when
    SWITCHBOARD_PEER_TOFU is on, and its standing says to hold its messages for an operator;
    otherwise `peer_refusal` says why it is refused (raised). `url` is what the caller claims:
    shown to operators, never a route (routes come only from the registry, configured or pinned
    peers and the relay)."""
    refusal = peer_refusal(public_key)
    if refusal is not None:
        raise refusal
    now = timezone.now()
    vouched = peer_vouched_tier(public_key)
    peer = Peer.objects.filter(public_key=public_key).first()
    if peer is None:
        try:
            with transaction.atomic():
                peer = Peer.objects.create(
                    public_key=public_key, name=name[:128], url=url[:512], tier=tier, last_seen=now
                )
                audit_event(
                    "peer.first_seen",
                    actor="hub",
                    target=public_key,
                    detail={"name": name[:128], "url": url[:512], "tier": tier, "vouched": vouched},
                )
        except IntegrityError:
            peer = Peer.objects.get(public_key=public_key)
    else:
        fields = {"last_seen": now}
        if url and not peer.pinned and peer.url != url:
            fields["url"] = url[:512]
        Peer.objects.filter(pk=peer.pk).update(**fields)
    # Revoked here means mode `hold` (`peer_refusal` raised for `refuse`).
    return PeerStanding(peer=peer, hold=peer.revoked, tier=vouched)


def peer_pin(
    *, public_key: str, name: str = "", url: str = "", tier: str = FederationTier.LAN, actor: Principal
) -> Peer:
    """An operator vouches for a hub key (and may give its URL, for the LAN tier)."""
    actor.require_operator()
    try:
        verify_key_from(public_key)
    except ValueError as exc:
        raise Invalid("bad_public_key", "public_key is a base64 Ed25519 public key (32 bytes).") from exc
    if tier not in FederationTier.values:
        raise Invalid("bad_tier", "tier is channel, lan or relay.")
    with transaction.atomic():
        peer, created = Peer.objects.update_or_create(
            public_key=public_key,
            defaults={"name": name[:128], "url": url.rstrip("/")[:512], "tier": tier, "pinned": True},
        )
        audit_event(
            "peer.pinned",
            actor=actor.actor,
            target=public_key,
            detail={"name": name, "url": url, "created": created},
        )
        announce("peer.changed", peer_summary(peer))
    return peer


def peer_pin_seen(*, peer_id: int, actor: Principal) -> Peer:
    """An operator vouches for the key a hub was first seen with, under the name and tier it was
    seen with. Not the URL it claimed: that is its own word, and a pinned LAN peer's URL is where
    this hub asks for names and sends their messages, so only an operator gives it (`peer_pin`)."""
    actor.require_operator()
    peer = Peer.objects.filter(pk=peer_id).first()
    if peer is None:
        raise NotFound("No peer hub with that id.")
    return peer_pin(public_key=peer.public_key, name=peer.name, tier=peer.tier, actor=actor)


def peer_revoke(*, peer_id: int, mode: str, actor: Principal) -> Peer:
    """An operator revokes a hub: its messages are then refused (`refuse`) or held (`hold`)."""
    actor.require_operator()
    if mode not in RevocationMode.values:
        raise Invalid("bad_revocation_mode", "mode is `refuse` or `hold`.")
    return _set_revoked(peer_id=peer_id, revoked=True, mode=mode, actor=actor)


def peer_restore(*, peer_id: int, actor: Principal) -> Peer:
    """An operator lifts a revocation."""
    actor.require_operator()
    return _set_revoked(peer_id=peer_id, revoked=False, mode=RevocationMode.REFUSE, actor=actor)


def _set_revoked(*, peer_id: int, revoked: bool, mode: str, actor: Principal) -> Peer:
    with transaction.atomic():
        peer = Peer.objects.select_for_update().filter(pk=peer_id).first()
        if peer is None:
            raise NotFound("No peer hub with that id.")
        peer.revoked = revoked
        peer.revocation_mode = mode
        peer.save(update_fields=["revoked", "revocation_mode"])
        audit_event(
            "peer.revoked" if revoked else "peer.restored",
            actor=actor.actor,
            target=peer.public_key,
            detail={"mode": mode} if revoked else {},
        )
        announce("peer.changed", peer_summary(peer))
    return peer


def peers_unvouched_prune(*, now: Any = None, batch: int = 1000) -> int:
    """Forget the contact records of keys nobody vouched for (first use: not pinned, not revoked,
    neither registered nor configured) that were not seen for SWITCHBOARD_REMOTE_SESSION_IDLE_SECONDS
    and have no stand-in left (`forwarding.remote_sessions_prune` keeps those while a message
    refers to them): keys cost nothing to make, and a signed call with a new one records a row.
    A key that calls again is recorded again, as on its first call. Returns how many went."""
    from federation.models import RemoteSession
    from federation.services.registry import registry_hub_keys

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SWITCHBOARD_REMOTE_SESSION_IDLE_SECONDS)
    vouched = {*registry_hub_keys().values(), *settings.SWITCHBOARD_LAN_PEER_KEYS.values()}
    stale = (
        Peer.objects.filter(pinned=False, revoked=False, last_seen__lt=cutoff)
        .exclude(public_key__in=vouched)
        .exclude(public_key__in=RemoteSession.objects.values("hub_key"))
    )
    ids = list(stale.values_list("pk", flat=True)[:batch])
    deleted, _ = Peer.objects.filter(pk__in=ids, pinned=False, revoked=False).delete()
    return deleted


PEERS_PAGE = 100
PEERS_PAGE_MAX = 1000


def peers_page(*, after: int = 0, limit: int = PEERS_PAGE) -> dict[str, Any]:
    """The peer hubs this hub knows, one page of them in id order: the first `limit` (1 to
    PEERS_PAGE_MAX) after the id `after`, and `next`, the `after` of the following page (None on
    the last). Every signed call with a new key records a row, so no answer lists them all."""
    limit = max(1, min(limit, PEERS_PAGE_MAX))
    rows = list(Peer.objects.filter(pk__gt=after).order_by("pk")[: limit + 1])
    return {
        "peers": [peer_summary(p) for p in rows[:limit]],
        "next": rows[limit - 1].pk if len(rows) > limit else None,
    }


def peer_is_revoked(public_key: str) -> bool:
    return Peer.objects.filter(public_key=public_key, revoked=True).exists()


def peer_vouched(public_key: str) -> bool:
    """Whether this hub vouches for `public_key` now, as `PeerStanding.vouched` says of a caller:
    a source vouches for it (`peer_vouched_tier`) and no operator revoked it."""
    return bool(peer_vouched_tier(public_key)) and not peer_is_revoked(public_key)


def session_isolation_set(*, session_id: str, isolated: bool, actor: Principal) -> bool:
    """An operator marks a session isolated (every message it sends off this machine is held for
    an operator) or lifts the mark. Returns the new setting."""
    from federation.models import SessionIsolation
    from messaging.models import AgentSession

    actor.require_operator()
    if not AgentSession.objects.filter(pk=session_id).exclude(kind="remote").exists():
        raise NotFound("No local session with that id.")
    with transaction.atomic():
        if isolated:
            SessionIsolation.objects.get_or_create(session_id=session_id, defaults={"set_by": actor.actor})
        else:
            SessionIsolation.objects.filter(session_id=session_id).delete()
        audit_event(
            "session.isolation", actor=actor.actor, target=str(session_id), detail={"isolated": isolated}
        )
    return isolated
