"""Peer hubs: recorded by public key on first contact (trust on first use) or pinned by an
operator; an operator can revoke one, after which its messages are refused or held for a human."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from federation.errors import PeerRevoked
from federation.models import FederationTier, Peer, RevocationMode
from federation.services.identity import verify_key_from
from messaging.errors import Forbidden, Invalid, NotFound
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.services.events import announce


@dataclass(frozen=True)
class PeerStanding:
    """How this hub treats a calling hub right now."""

    peer: Peer
    hold: bool  # revoked with mode "hold": accept, but hold with escalate=required


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


def peer_seen(
    *, public_key: str, name: str = "", url: str = "", tier: str, vouched: bool = False
) -> PeerStanding:
    """Record contact from the hub holding `public_key` and say whether it may talk to us.

    Unknown keys are recorded on first use when SWITCHBOARD_PEER_TOFU is on (or when `vouched`:
    the key came from this machine's registry); otherwise only operator-pinned keys get through.
    A revoked peer raises PeerRevoked unless its revocation mode is `hold`."""
    now = timezone.now()
    peer = Peer.objects.filter(public_key=public_key).first()
    if peer is None:
        if not (settings.SWITCHBOARD_PEER_TOFU or vouched):
            raise Forbidden(
                "This hub accepts only peers an operator pinned; ask its operator to pin your key."
            )
        try:
            with transaction.atomic():
                peer = Peer.objects.create(
                    public_key=public_key, name=name[:128], url=url[:512], tier=tier, last_seen=now
                )
                audit_event(
                    "peer.first_seen",
                    actor="hub",
                    target=public_key,
                    detail={"name": name[:128], "url": url[:512], "tier": tier},
                )
        except IntegrityError:
            peer = Peer.objects.get(public_key=public_key)
    else:
        fields = {"last_seen": now}
        if url and not peer.pinned and peer.url != url:
            fields["url"] = url[:512]
        Peer.objects.filter(pk=peer.pk).update(**fields)
    if peer.revoked:
        if peer.revocation_mode == RevocationMode.HOLD:
            return PeerStanding(peer=peer, hold=True)
        raise PeerRevoked(f"An operator of this hub revoked the hub {peer.name or public_key[:12]}.")
    return PeerStanding(peer=peer, hold=False)


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


def peers_list() -> list[dict[str, object]]:
    return [peer_summary(p) for p in Peer.objects.order_by("name", "pk")]


def peer_is_revoked(public_key: str) -> bool:
    return Peer.objects.filter(public_key=public_key, revoked=True).exists()


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
