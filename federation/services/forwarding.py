"""Routing a message to another hub, forwarding it there, and accepting what other hubs forward.

Sending side: when no local session takes an address, `route_for_send` tries the channel tier
(this machine's registry), then LAN peers (asked "do you host X?", answers cached), then the relay
(which knows only which hub holds a lease on a name, and is believed only with that hub's signed
statement for the name). The delivery is written `relayed` (or held,
when the hub or the sender is isolated) and `forward_attempt` carries it over, to the relay or to
the channel or LAN hub, on the sender's own thread before the send is answered
(`forwards_hand_over`), so the answer says whether it was taken or refused. It is retried with
backoff on transient errors, re-routed to the next tier when a hub says it no longer hosts the
agent, and failed, with the reason, when the relay or the hub refuses it or nothing takes it.

Receiving side: `inbound_accept` checks the hop count and the origin hub's signature (made for
this hub, or for the hub that carried it onward), records the peer, and runs the ordinary send
pipeline for the local recipient with the trust the check earned (`<tier>-verified`, or
`unverified` + sensitive). A message id is accepted once per sending hub (the origin when its
signature holds, else the calling hub), so a retried forward never delivers twice.
"""

from __future__ import annotations

import base64
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone
from nacl.exceptions import CryptoError
from nacl.public import PublicKey, SealedBox

from federation.errors import HopLimit, PermanentError, RelayQuotaFull, TransientError, Unreachable
from federation.models import FederationTier, InboundMessage, RemoteDelivery, RemoteSession
from federation.services.files import (
    envelope_file_heads,
    files_for_envelope,
    files_limits_check,
    files_receive,
)
from federation.services.hub_shares import peer_holds_checked, stopped_holds_checked_for_hub
from federation.services.identity import hub_identity, key_fingerprint, verify_key_from
from federation.services.keys import (
    hub_key_pinned,
    hub_urls_verified,
    lan_peer_key,
    lease_unverified_record,
    relay_key,
)
from federation.services.lookups import LookupCache
from federation.services.peers import PeerStanding, peer_seen, peer_vouched_tier
from federation.services.registry import registry_drop_hub, registry_entries, registry_hub_keys
from federation.services.relay import relay_lease_entry_problem
from federation.services.signatures import (
    MESSAGE_SIGNATURE_VERSION,
    envelope_sign,
    envelope_verify,
    lease_statement_seconds_left,
)
from federation.transport import SEALED_TYPE, hub_call
from messaging.addressing import Candidate, Resolution, normalize_name, resolve
from messaging.credentials import hash_token
from messaging.errors import Ambiguous, Invalid, NotFound, PinConflict, TooLarge, Unavailable
from messaging.hold_reasons import ISOLATION_HOLD, STOPPED_HOLD, UNKNOWN_PEER_HOLD
from messaging.jobs import enqueue
from messaging.liveness import LIVE
from messaging.models import AgentSession, Delivery, Message, Priority, SessionStatus
from messaging.principals import HUB
from messaging.services.audit import audit_event
from messaging.services.delivery import delivery_transition
from messaging.states import DeliveryState

log = logging.getLogger(__name__)
S = DeliveryState
REMOTE_KIND = "remote"
TIER_ORDER = (FederationTier.CHANNEL, FederationTier.LAN, FederationTier.RELAY)
MAX_FORWARD_ATTEMPTS = 8
MAX_REROUTES = 4
# Deliveries for other hubs (or the relay) one send hands over before it is answered; the rest go
# to the background job.
HAND_OVER_AT_ONCE = 20
# A delivery accepted for another hub is carried at once (hand-over or job); one still pending this
# long after (its process stopped before carrying it) is the forward sweeper's (`forwards_due`).
CARRY_GRACE = timedelta(seconds=60)
# "Do you host X?" answers, LAN peers' and the relay's, kept as `federation.services.lookups` says.
_hosts_cache: LookupCache[tuple[str, str], dict[str, Any] | None] = LookupCache()


@dataclass(frozen=True)
class RemoteRoute:
    """Where another hub hosts the addressed agent, and on which tier we reach it."""

    tier: str
    hub_key: str
    hub_name: str
    url: str  # the hub's URL (channel, LAN) or the relay's (relay)
    remote_id: str
    name: str
    ref: str


@dataclass
class SendRoute:
    """What `message_send` needs to write a delivery to a remote agent."""

    route: RemoteRoute
    recipient: AgentSession
    resolution: Resolution
    target: str

    @property
    def tier(self) -> str:
        return self.route.tier

    def decide(self, *, sender: AgentSession, text: str, kind: str, now: Any) -> Any:
        """Relayed, or held for an operator when messages may not leave this machine."""
        from messaging.sensitivity import classify
        from messaging.services.decision import Decision
        from messaging.services.holds import hold_expiry_for

        tier = classify(text, kind=kind).tier
        if isolation_applies(sender=sender, route=self.route):
            return Decision(
                state=S.HELD,
                hold_reason=ISOLATION_HOLD,
                expires_at=hold_expiry_for(self.recipient, now),
                tier=tier,
                reason="this hub holds every message leaving the machine for an operator",
            )
        return Decision(state=S.RELAYED, tier=tier)

    def attach(self, delivery: Delivery) -> None:
        """Record where the delivery goes. A relayed one is carried once the transaction commits,
        on every tier, by the send's hand-over (`forwards_hand_over`: on the sender's thread, or
        the background job it starts); past CARRY_GRACE, by the forward sweeper."""
        relayed = delivery.state == S.RELAYED
        RemoteDelivery.objects.create(
            delivery_id=delivery.pk,
            message_id=delivery.message_id,
            tier=self.route.tier,
            target=self.target,
            hub_key=self.route.hub_key,
            url=self.route.url,
            remote_state="pending",
            next_attempt_at=timezone.now() + CARRY_GRACE if relayed else None,
        )


@dataclass(frozen=True)
class InboundContext:
    """What `message_send` needs to write a message another hub forwarded here (the context of
    its `messaging.services.request.Origin`)."""

    message_id: uuid.UUID | None  # the id it takes here; None: a new one (`_local_message_id`)
    tier: str
    trust: str
    hold_reason: str = ""  # peer_revoked, unknown_peer: hold for an operator with escalate=required
    # This hub vouches for every key the message rests on and its signature holds. When not, the
    # pipeline resolves its address only when it names a session exactly
    # (`Origin.exact_address_only`): a hub nobody vouched for never reaches an agent by a prefix.
    vouched: bool = False

    def adjust(self, decision: Any, *, recipient: AgentSession, now: Any) -> Any:
        from messaging.services.holds import hold_expiry_for

        if self.hold_reason and decision.state != S.REFUSED:
            decision.state = S.HELD
            decision.hold_reason = self.hold_reason
            decision.escalate = "required"
            decision.expires_at = hold_expiry_for(recipient, now)
        return decision


# --- where is it? ---------------------------------------------------------------------------------


def isolation_applies(*, sender: AgentSession, route: RemoteRoute) -> bool:
    """Isolation holds what leaves the machine (LAN and relay, not the channel tier): everything
    when the hub is isolated, or what a session marked isolated (`SessionIsolation`) sends."""
    if route.tier == FederationTier.CHANNEL:
        return False  # the channel tier stays on this machine
    if settings.SWITCHBOARD_ISOLATED:
        return True
    from federation.models import SessionIsolation

    return SessionIsolation.objects.filter(session_id=sender.id).exists()


def _channel_route(target: str, exclude: set[str]) -> RemoteRoute | None:
    entries = [e for e in registry_entries() if e.hub_key not in exclude]
    if not entries:
        return None
    by_id = {e.session_id: e for e in entries}
    try:
        found = resolve(
            target, [Candidate(e.session_id, e.ref, e.name, e.name_key, e.cwd) for e in entries]
        ).candidate
    except NotFound:
        return None
    e = by_id[found.id]
    return RemoteRoute(FederationTier.CHANNEL, e.hub_key, e.hub_name, e.url, e.session_id, e.name, e.ref)


def lan_peer_urls() -> list[str]:
    from federation.models import Peer
    from federation.services.mdns import mdns_peer_urls

    urls = list(settings.SWITCHBOARD_LAN_PEERS)
    urls += [u for u in mdns_peer_urls() if u not in urls]
    # Only peers an operator pinned: a hub that merely contacted us never becomes one we ask.
    for url in (
        Peer.objects.filter(tier=FederationTier.LAN, pinned=True, revoked=False)
        .exclude(url="")
        .values_list("url", flat=True)
    ):
        if url not in urls:
            urls.append(url)
    return urls


def hosts_lookup(url: str, target: str) -> dict[str, Any] | None:
    """Ask the hub at `url` whether it hosts `target`. Its own answer, yes or no (signed by the key
    held for it: a 2xx, or a 4xx refusal), is remembered as its word; no answer (unreachable, 5xx,
    or one it did not sign: someone on the path) only briefly (`federation.services.lookups`)."""
    key = (url, normalize_name(target))
    hit, cached = _hosts_cache.get(key)
    if hit:
        return cached
    from urllib.parse import quote

    # Only a peer whose key this hub holds from a verified source is asked: what is forwarded to
    # it is sealed to that key, and an answer naming another key is not a route.
    dest_key = lan_peer_key(url)
    if dest_key is None:
        log.info("LAN peer %s skipped: no configured (url#key) or pinned key for it", url)
        return None
    answer = None
    try:
        answer = hub_call(
            "GET", url, f"/federation/agents?to={quote(target)}", dest_key=dest_key, timeout=1.5
        )
    except TransientError as exc:
        log.info("LAN peer %s did not answer for %r: %s", url, target, exc)
        _hosts_cache.unanswered(key, None)
        return None
    except PermanentError as exc:
        log.info("LAN peer %s refused to say whether it hosts %r: %s", url, target, exc)
    found = (
        answer
        if isinstance(answer, dict) and answer.get("hosted") and answer.get("hub_key") == dest_key
        else None
    )
    _hosts_cache.answered(key, found)
    return found


def hosts_cache_clear() -> None:
    _hosts_cache.clear()


def _lan_route(target: str, exclude: set[str]) -> RemoteRoute | None:
    me = hub_identity().public_key
    # Only hubs this hub was told to ask (configured, discovered, operator-pinned): a hub that
    # merely called here, whatever URL it gave, is never asked, so it can never become a route.
    for url in lan_peer_urls():
        found = hosts_lookup(url, target)
        if not found or found.get("hub_key") in exclude or found.get("hub_key") == me:
            continue
        return RemoteRoute(
            FederationTier.LAN,
            str(found["hub_key"]),
            str(found.get("hub_name", "")),
            url,
            str(found.get("id", "")),
            str(found.get("name", target)),
            str(found.get("ref", "")),
        )
    return None


def _relay_route(target: str, exclude: set[str]) -> RemoteRoute | None:
    relay = settings.SWITCHBOARD_RELAY_URL
    if not relay:
        return None
    from messaging.addressing import parse_address

    address = parse_address(target)
    # The relay knows names only (leases): `name [ref]` asks for the name.
    found = hosts_lookup_relay(relay, address.name_ref[0] if address.name_ref else target)
    if not found or found.get("hub_key") in exclude or found.get("hub_key") == hub_identity().public_key:
        return None
    return RemoteRoute(
        FederationTier.RELAY,
        str(found["hub_key"]),
        str(found.get("hub_name", "")),
        relay,
        f"name:{normalize_name(str(found.get('name', target)))}",
        str(found.get("name", target)),
        "",
    )


def hosts_lookup_relay(relay: str, target: str) -> dict[str, Any] | None:
    """Ask the relay which hub holds the lease on `target`. The relay's yes is believed only with
    the named hub's own signed statement for `target` and this relay, still fresh
    (`relay_lease_entry_problem`): a relay cannot send a name's messages to another hub this hub
    trusts. A yes not believed counts as no (logged and audited, `federation.lease_unverified`).
    A yes is cached like LAN answers, never past its statement; a no is not, so an agent that
    just registered somewhere is reachable at once."""
    from urllib.parse import quote

    key = (f"relay:{relay}", normalize_name(target))
    hit, cached = _hosts_cache.get(key)
    if hit:
        return cached
    try:
        dest = relay_key()
        answer = hub_call("GET", relay, f"/relay/agents?to={quote(target)}", dest_key=dest, timeout=1.5)
    except (TransientError, PermanentError) as exc:
        log.info("relay %s did not answer for %r: %s", relay, target, exc)
        return None
    found = answer if isinstance(answer, dict) and answer.get("hosted") else None
    if not found:
        return None
    problem = relay_lease_entry_problem(found, asked=target, relay_key=dest)
    if problem is not None:
        lease_unverified_record(
            relay=relay, hub_key=str(found.get("hub_key", "")), agent=normalize_name(target), problem=problem
        )
        return None
    _hosts_cache.answered(key, found, good_for=lease_statement_seconds_left(found["statement"]))
    return found


def route_find(
    *, target: str, exclude: set[str] | None = None, tiers: tuple[str, ...] = TIER_ORDER
) -> RemoteRoute | None:
    """The first tier (channel → LAN → relay) on which some other hub hosts `target`, or None."""
    from federation.models import Peer

    exclude = set(exclude or ()) | set(Peer.objects.filter(revoked=True).values_list("public_key", flat=True))
    finders = {
        FederationTier.CHANNEL: _channel_route,
        FederationTier.LAN: _lan_route,
        FederationTier.RELAY: _relay_route,
    }
    for tier in tiers:
        route = finders[tier](target, exclude)
        if route is not None:
            return route
    return None


def remote_name(name: str) -> str:
    """Another hub's word for an agent's name, held to this hub's rules: a name that breaks them
    (control characters, quotes) or that is reserved here (`operator`, `hub`, ...) is shown as
    `remote-<name>` or `remote-agent`, never as it came."""
    from messaging.names import clean_name, name_problem
    from messaging.services.sessions import RESERVED_NAMES

    if name_problem(name):
        return "remote-agent"
    cleaned = clean_name(name)
    if normalize_name(cleaned) in RESERVED_NAMES:
        return f"remote-{cleaned}"[:64]
    return cleaned


OVERFLOW_REMOTE_ID = "overflow"
# The sending hub of a message pulled from the relay whose signature does not verify: no key vouches
# for it, and its stand-ins and "accepted once" records are kept apart from every real hub's.
UNSIGNED_SENDER = "unsigned"
OVERFLOW_NAME = "remote-others"


def remote_session_for(
    *, hub_key: str, hub_name: str, remote_id: str, name: str, ref: str, capped: bool = False
) -> AgentSession:
    """The local stand-in for an agent of another hub (created once per hub and remote id).

    `capped` (what another hub's message names as its sender): a hub gets at most
    SWITCHBOARD_REMOTE_SESSIONS_PER_PEER stand-ins; past that, every new sender of that hub shares
    one (`remote-others`), so rotating sender ids neither adds rows without bound nor gets each
    id its own sender→recipient rate limit."""
    name = remote_name(name)
    ref = ref if ref.isalnum() else ""
    link = (
        RemoteSession.objects.filter(hub_key=hub_key, remote_id=remote_id).select_related("session").first()
    )
    cap = settings.SWITCHBOARD_REMOTE_SESSIONS_PER_PEER
    if link is None and capped and RemoteSession.objects.filter(hub_key=hub_key).count() >= cap:
        remote_id, name, ref = OVERFLOW_REMOTE_ID, OVERFLOW_NAME, ""
        link = (
            RemoteSession.objects.filter(hub_key=hub_key, remote_id=remote_id)
            .select_related("session")
            .first()
        )
    now = timezone.now()
    if link is not None:
        session = link.session
        fields: dict[str, Any] = {}
        if session.name != name and name:
            fields.update(name=name, name_key=normalize_name(name))
        if session.last_seen is None or now - session.last_seen > timedelta(minutes=1):
            fields["last_seen"] = now  # in use: `remote_sessions_prune` leaves it alone
        if fields:
            AgentSession.objects.filter(pk=session.pk).update(**fields)
            for field, value in fields.items():
                setattr(session, field, value)
        return session
    from messaging.services.sessions import new_ref

    for attempt in range(8):
        wanted_ref = ref.lower() if (ref and attempt == 0) else new_ref()
        try:
            with transaction.atomic():
                session = AgentSession.objects.create(
                    name=name[:64] or "remote",
                    name_key=normalize_name(name[:64] or "remote"),
                    ref=wanted_ref[:12],
                    kind=REMOTE_KIND,
                    status=SessionStatus.EXITED,  # never a local recipient, never authenticates
                    peer_address=f"hub:{key_fingerprint(hub_key)}",
                    token_hash=hash_token(f"remote:{uuid.uuid4()}"),
                    last_seen=now,
                    status_changed_at=now,
                )
                RemoteSession.objects.create(
                    session=session,
                    hub_key=hub_key,
                    hub_name=hub_name[:128],
                    remote_id=remote_id[:64],
                    remote_name=name[:64],
                    remote_ref=ref[:12],
                )
            return session
        except IntegrityError:
            link = RemoteSession.objects.filter(hub_key=hub_key, remote_id=remote_id).first()
            if link is not None:
                return link.session
    raise RuntimeError("could not create a stand-in session for a remote agent")


def remote_session_for_route(route: RemoteRoute) -> AgentSession:
    return remote_session_for(
        hub_key=route.hub_key,
        hub_name=route.hub_name,
        remote_id=route.remote_id,
        name=route.name,
        ref=route.ref,
    )


def remote_sessions_prune(*, now: Any = None, batch: int = 1000) -> int:
    """Delete stand-ins for remote agents that nothing refers to (no message from them, no
    delivery to them, no pin or sender rule naming them) and that were not used for
    SWITCHBOARD_REMOTE_SESSION_IDLE_SECONDS. Returns how many went."""
    from django.db.models import Exists, OuterRef

    from messaging.models import Pin, SenderPolicy

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SWITCHBOARD_REMOTE_SESSION_IDLE_SECONDS)
    unused = (
        AgentSession.objects.filter(kind=REMOTE_KIND, last_seen__lt=cutoff)
        .exclude(Exists(Message.objects.filter(sender_id=OuterRef("pk"))))
        .exclude(Exists(Delivery.objects.filter(recipient_id=OuterRef("pk"))))
        .exclude(Exists(Pin.objects.filter(Q(sender_id=OuterRef("pk")) | Q(recipient_id=OuterRef("pk")))))
        .exclude(
            Exists(SenderPolicy.objects.filter(Q(sender_id=OuterRef("pk")) | Q(recipient_id=OuterRef("pk"))))
        )
    )
    ids = list(unused.values_list("pk", flat=True)[:batch])
    if not ids:
        return 0
    deleted, _ = AgentSession.objects.filter(pk__in=ids, kind=REMOTE_KIND).delete()
    RemoteSession.objects.filter(session_id__in=ids).delete()
    return len(ids) if deleted else 0


def remote_hub_name(session_id: Any, *, vouched: bool = True) -> str:
    """The name of the hub a remote stand-in session belongs to (what that hub calls itself),
    shown as FROM_HUB. Shown as the start of the hub's key instead when the name is not earned:
    the message was not from a hub this hub vouches for (`vouched=False`: its trust is not
    `<tier>-verified`), the name breaks this hub's rules, or it is this hub's own name. So a remote
    sender never reads as one of this hub's, nor a stranger as a hub it knows by name."""
    from messaging.names import name_problem

    link = RemoteSession.objects.filter(session_id=session_id).first()
    if link is None:
        return "unknown"
    name = link.hub_name
    if (
        not vouched
        or not name
        or name_problem(name)
        or normalize_name(name) == normalize_name(hub_identity().name)
    ):
        return link.hub_key[:12]
    return name


def route_for_send(*, sender: AgentSession, target: str) -> SendRoute | None:
    """Called by `message_send` when no local session takes `target`: the remote route, or None."""
    if sender.kind == REMOTE_KIND or settings.SWITCHBOARD_ROLE == "relay":
        return None
    route = route_find(target=target)
    if route is None:
        return None
    recipient = remote_session_for_route(route)
    candidate = Candidate(str(recipient.id), recipient.ref, recipient.name, recipient.name_key)
    return SendRoute(
        route=route, recipient=recipient, resolution=Resolution(candidate, "remote", None), target=target
    )


# --- carrying it over -----------------------------------------------------------------------------


def envelope_build(*, message: Message, target: str, dest_key: str, hops: int = 1) -> dict[str, Any]:
    """The signed, self-contained description of a message that travels between hubs, made for the
    hub holding `dest_key` (the key it is then sealed to): the signature names that hub, so no other
    hub accepts it as sent there."""
    me = hub_identity()
    sender = message.sender
    envelope = {
        "v": MESSAGE_SIGNATURE_VERSION,
        "id": str(message.id),
        "from": {
            "hub": me.public_key,
            "hub_name": me.name,
            "url": settings.SWITCHBOARD_PUBLIC_URL,
            "id": str(sender.id) if sender else "",
            "name": sender.name if sender else "hub",
            "ref": sender.ref if sender else "",
        },
        "to": target,
        "dest": dest_key,
        "text": message.text,
        "summary": message.summary,
        "kind": message.kind,
        "priority": Priority(message.priority).label,
        "created_at": message.created_at.isoformat(),
        "hops": hops,
        "files": files_for_envelope(message_id=message.id),
    }
    return envelope_sign(envelope)


def seal_for_hub(*, hub_key: str, payload: bytes) -> bytes:
    """Encrypt `payload` so only the hub holding `hub_key`'s private key can read it."""
    curve = verify_key_from(hub_key).to_curve25519_public_key()
    return SealedBox(PublicKey(bytes(curve))).encrypt(payload)


def unseal(sealed: bytes) -> bytes:
    """Open a sealed box addressed to this hub (nacl CryptoError when it was not)."""
    return SealedBox(hub_identity().signing_key.to_curve25519_private_key()).decrypt(sealed)


def envelope_open(raw: bytes, *, content_type: str) -> bytes:
    """The forwarded body a hub sealed to this hub (channel, LAN). A body in clear is refused:
    messages and files never cross between hubs readable on the wire."""
    if content_type != SEALED_TYPE:
        raise Invalid(
            "unsealed",
            f"Hubs seal what they forward to this hub's key (Content-Type {SEALED_TYPE}); "
            "a message in clear is refused.",
        )
    try:
        return unseal(raw)
    except (CryptoError, ValueError, TypeError) as exc:
        raise Invalid("bad_seal", "The forwarded message is not sealed to this hub's key.") from exc


class UnverifiedKey(Exception):
    """The key a forward would be sealed to is not one this hub holds from a verified source."""


def route_key_verified(*, tier: str, url: str, hub_key: str) -> str:
    """`hub_key` when this hub may seal to it on `tier` (see `federation.services.keys`); raises
    UnverifiedKey with the reason, in words an operator can act on, when it may not."""
    if tier == FederationTier.CHANNEL:
        if hub_key in registry_hub_keys().values():
            return hub_key
        raise UnverifiedKey("the hub is no longer in this machine's registry")
    if tier == FederationTier.LAN:
        if lan_peer_key(url) == hub_key:
            return hub_key
        raise UnverifiedKey(
            f"this hub holds no verified key for the LAN peer at {url} that matches it (configure "
            "SWITCHBOARD_LAN_PEERS=url#key or pin the peer's key); nothing was sent"
        )
    if hub_key_pinned(hub_key):
        return hub_key
    raise UnverifiedKey(
        f"the relay says the agent is at hub key {hub_key[:16]}…, which no operator of this hub pinned; "
        "pin that hub's key (after checking it with its operator) to send there; nothing was sent"
    )


def envelope_send(
    *, tier: str, url: str, hub_key: str, envelope: dict[str, Any], agent: str
) -> dict[str, Any]:
    """Carry a signed envelope to the hub holding `hub_key`, sealed to that key (verified first:
    `route_key_verified`): straight to its URL (channel, LAN) or into the relay at `url` for the
    agent's leased name. The envelope is one this hub built for `hub_key` (`envelope_build`), or one
    signed for this hub that it carries onward. Raises UnverifiedKey, TransientError or
    PermanentError."""
    route_key_verified(tier=tier, url=url, hub_key=hub_key)
    payload = _json_bytes(envelope if tier == FederationTier.RELAY else {"tier": tier, "envelope": envelope})
    try:
        sealed = seal_for_hub(hub_key=hub_key, payload=payload)
    except (ValueError, CryptoError) as exc:
        raise UnverifiedKey(f"the hub key {hub_key[:16]}… is not a usable key ({exc})") from exc
    if tier == FederationTier.RELAY:
        hub_call(
            "POST",
            url,
            "/relay/messages",
            {
                "message_id": envelope["id"],
                "dest_hub": hub_key,
                "agent": agent,
                "sealed": base64.b64encode(sealed).decode("ascii"),
            },
            dest_key=relay_key(),
        )
        return {"status": "at_relay"}
    return hub_call("POST", url, "/federation/messages", sealed=sealed, dest_key=hub_key) or {}


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(300, 2 ** min(attempts, 8)))


def forward_attempt(*, delivery_id: int) -> str:
    """Carry one remote delivery to its hub (or the relay). Idempotent: a delivery already handed
    over is left alone, and the receiving hub accepts a message id only once anyway."""
    from federation.services.receipts import receipt_apply_local

    rd = RemoteDelivery.objects.filter(delivery_id=delivery_id).first()
    if rd is None:
        return "unknown"
    delivery = (
        Delivery.objects.select_related("message", "message__sender", "recipient")
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.state not in (S.RELAYED, S.QUEUED):
        RemoteDelivery.objects.filter(pk=rd.pk).update(next_attempt_at=None)  # the sweeper lets it be
        return "not-forwardable"
    if rd.remote_state not in ("pending", "retry"):
        return "already-forwarded"
    for _ in range(MAX_REROUTES):
        try:
            files_limits_check(message_id=delivery.message_id, tier=rd.tier)
        except TooLarge as exc:
            _fail(rd, delivery, reason=exc.detail)
            return "failed"
        # The relay and the hub behind it know the agent by the leased name, not this hub's address.
        to = delivery.recipient.name if rd.tier == FederationTier.RELAY else rd.target
        envelope = envelope_build(message=delivery.message, target=to, dest_key=rd.hub_key)
        try:
            answer = envelope_send(tier=rd.tier, url=rd.url, hub_key=rd.hub_key, envelope=envelope, agent=to)
        except UnverifiedKey as exc:
            if rd.tier == FederationTier.CHANNEL:
                # Its registry entry went (it stopped answering): another hub may host the agent,
                # or this one may announce itself again before the retries run out.
                if _reroute(rd, delivery, reason=str(exc)):
                    continue
                return _retry_later(rd, delivery, error=str(exc))
            _unverified_key(rd, delivery, reason=str(exc))
            return "failed"
        except TransientError as exc:
            if rd.tier == FederationTier.RELAY and _error_code(exc.body) == RelayQuotaFull.code:
                # The relay's answer that this hub keeps all it may there: waiting out the backoff
                # rarely frees it, and the sender is told now, in the relay's words.
                _fail(rd, delivery, reason=f"the relay refused it: {_detail(exc.body)}")
                return "failed"
            if rd.tier == FederationTier.CHANNEL and isinstance(exc, Unreachable):
                registry_drop_hub(hub_key=rd.hub_key)  # its entry said live; nothing answers there
                if _reroute(rd, delivery, reason=str(exc)):
                    continue
            return _retry_later(rd, delivery, error=str(exc))
        except PermanentError as exc:
            if exc.status in (403, 404) and _reroute(rd, delivery, reason=str(exc)):
                continue
            _fail(rd, delivery, reason=f"{_carrier(rd)} refused it: {_detail(exc.body)}")
            return "failed"
        remote_state = str((answer or {}).get("status", "accepted"))
        RemoteDelivery.objects.filter(pk=rd.pk).update(
            # The answer replaces only what this hub wrote while carrying it: a receipt that came
            # back meanwhile (another attempt got there first) is a later word than this answer.
            remote_state=Case(
                When(remote_state__in=("pending", "retry"), then=Value(remote_state)),
                default=F("remote_state"),
            ),
            attempts=rd.attempts + 1,
            last_error="",
            next_attempt_at=None,
        )
        audit_event(
            "federation.forwarded",
            actor="hub",
            target=rd.hub_key,
            message=delivery.message,
            delivery_id=delivery.pk,
            detail={"tier": rd.tier, "remote_state": remote_state},
        )
        receipt_apply_local(delivery_id=delivery.pk, state=remote_state, reason="answered by the other hub")
        return remote_state
    _fail(rd, delivery, reason="no hub took it after re-routing")
    return "failed"


def _unverified_key(rd: RemoteDelivery, delivery: Delivery, *, reason: str) -> None:
    """Fail a forward whose destination key this hub never verified, and tell the operators:
    a relay naming a new key for an agent (a lapsed lease taken by another hub) shows here."""
    _fail(rd, delivery, reason=reason)
    audit_event(
        "federation.key_unverified",
        actor="hub",
        target=rd.hub_key,
        message=delivery.message,
        delivery_id=delivery.pk,
        detail={"tier": rd.tier, "url": rd.url[:200], "agent": rd.target[:200]},
    )


def _detail(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)[:300]
    return str(body)[:300]


def _error_code(body: Any) -> str:
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _carrier(rd: RemoteDelivery) -> str:
    """Who a forward was handed to, in a failure's reason: the relay, or the other hub."""
    return "the relay" if rd.tier == FederationTier.RELAY else "the other hub"


def _json_bytes(data: Any) -> bytes:
    import json

    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def _reroute(rd: RemoteDelivery, delivery: Delivery, *, reason: str) -> bool:
    """Point the delivery at the next hub that hosts the target; False when none does."""
    tried = {k for k in rd.tried_hubs.split(",") if k} | {rd.hub_key}
    route = route_find(target=rd.target, exclude=tried)
    if route is None:
        return False
    sender = delivery.message.sender
    if delivery.state == S.RELAYED and sender is not None and isolation_applies(sender=sender, route=route):
        return False  # leaving the machine needs an operator's approval, which this one never had
    recipient = remote_session_for_route(route)
    with transaction.atomic():
        Delivery.objects.filter(pk=delivery.pk).update(tier=route.tier, recipient=recipient)
        delivery.recipient, delivery.tier = recipient, route.tier
        rd.tried_hubs = ",".join(sorted(tried))
        rd.tier, rd.hub_key, rd.url = route.tier, route.hub_key, route.url
        rd.save(update_fields=["tier", "hub_key", "url", "tried_hubs", "updated_at"])
        audit_event(
            "federation.rerouted",
            actor="hub",
            target=route.hub_key,
            delivery_id=delivery.pk,
            detail={"tier": route.tier, "because": reason[:200], "message_id": str(delivery.message_id)},
        )
    return True


def _retry_later(rd: RemoteDelivery, delivery: Delivery, *, error: str) -> str:
    attempts = rd.attempts + 1
    if attempts >= MAX_FORWARD_ATTEMPTS:
        _fail(rd, delivery, reason=f"{_carrier(rd)} stayed unreachable ({error[:200]})")
        return "failed"
    RemoteDelivery.objects.filter(pk=rd.pk).update(
        remote_state="retry",
        attempts=attempts,
        last_error=error[:500],
        next_attempt_at=timezone.now() + _backoff(attempts),
    )
    return "retry"


def _fail(rd: RemoteDelivery, delivery: Delivery, *, reason: str) -> None:
    """Fail the delivery for good, its reason kept where the sender reads it (`decision_reason`)."""
    with transaction.atomic():
        RemoteDelivery.objects.filter(pk=rd.pk).update(
            remote_state="failed", last_error=reason[:500], next_attempt_at=None
        )
        delivery_transition(
            Delivery.objects.filter(pk=delivery.pk),
            to=S.FAILED,
            actor=HUB,
            reason=reason[:300],
            updates={"decision_reason": reason[:500]},
        )


def forwards_expire_unclaimed(*, now: Any = None) -> int:
    """Fail relayed deliveries the relay held longer than it keeps anything (plus an hour's grace):
    nobody pulled them, so the sender should stop waiting."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SWITCHBOARD_RELAY_EXPIRY_SECONDS + 3600)
    stale = list(
        RemoteDelivery.objects.filter(
            tier=FederationTier.RELAY, remote_state="at_relay", updated_at__lt=cutoff
        )[:500]
    )
    for rd in stale:
        delivery = Delivery.objects.filter(pk=rd.delivery_id).first()
        if delivery is not None:
            _fail(rd, delivery, reason="no hub picked it up from the relay before it expired")
    return len(stale)


def forward_released(*, delivery_id: int) -> None:
    """Carry a delivery an operator released for another hub's agent, once the release commits:
    by the background job, and past CARRY_GRACE by the forward sweeper, which a held delivery's
    remote part was kept from (a job lost with the broker would otherwise leave it pending)."""
    RemoteDelivery.objects.filter(delivery_id=delivery_id, remote_state="pending").update(
        next_attempt_at=timezone.now() + CARRY_GRACE
    )
    enqueue("federation.tasks.forward_delivery", delivery_id)


def forwards_hand_over(*, delivery_ids: list[int]) -> None:
    """Carry the deliveries a send just committed for other hubs now, on the sender's thread
    before it is answered, whatever the tier: its answer then says whether the relay or the other
    hub (channel, LAN) took the message (`relayed`), refused it (`failed`, with its reason) or
    could not be reached (`relayed`, retried with backoff). At most HAND_OVER_AT_ONCE per send, and
    none after one that was not answered (a hub or relay out of reach costs the sender one
    timeout, not one per message); the rest, and those of a send whose transaction has not
    committed yet, go to the background job."""
    due = list(
        RemoteDelivery.objects.filter(delivery_id__in=delivery_ids, remote_state="pending")
        .order_by("id")
        .values_list("delivery_id", flat=True)
    )
    at_once = [] if transaction.get_connection().in_atomic_block else due[:HAND_OVER_AT_ONCE]
    handed = 0
    for delivery_id in at_once:
        handed += 1
        try:
            carried = forward_attempt(delivery_id=delivery_id)
        except Exception:
            # The message is committed; the sweeper carries it once CARRY_GRACE has passed.
            log.exception("delivery %s not handed over; the forward sweeper will", delivery_id)
            continue
        if carried == "retry":
            # The relay or hub did not answer: each of the rest could wait as long on the sender's
            # thread. They go to the background job instead.
            break
    for delivery_id in due[handed:]:
        enqueue("federation.tasks.forward_delivery", delivery_id)


def forwards_due(*, now: Any = None, batch: int = 100) -> list[int]:
    """Remote deliveries whose retry time has come, and relayed ones nothing carried within
    CARRY_GRACE of their acceptance (still `pending`)."""
    now = now or timezone.now()
    return list(
        RemoteDelivery.objects.filter(remote_state__in=("retry", "pending"), next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("delivery_id", flat=True)[:batch]
    )


# --- receiving ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InboundResult:
    message_id: str
    state: str
    duplicate: bool
    trust: str
    delivery_id: int | None
    detail: str = ""  # for the sending hub: why a held message waits


def _check_envelope(envelope: Any) -> dict[str, Any]:
    if not isinstance(envelope, dict):
        raise Invalid("bad_envelope", "The forwarded message is not an object.")
    sender = envelope.get("from")
    if not isinstance(sender, dict) or not isinstance(sender.get("hub"), str):
        raise Invalid("bad_envelope", "The forwarded message does not name its hub.")
    for key in ("to", "text"):
        if not isinstance(envelope.get(key), str):
            raise Invalid("bad_envelope", f"The forwarded message has no `{key}`.")
    try:
        uuid.UUID(str(envelope.get("id")))
    except ValueError as exc:
        raise Invalid("bad_envelope", "The forwarded message id is not a UUID.") from exc
    return envelope


def inbound_accept(
    *,
    envelope: Any,
    caller_key: str | None,
    tier: str = FederationTier.RELAY,
    caller_address: str = "",
) -> InboundResult:
    """Take a message another hub forwarded (directly, or pulled from the relay) for a local agent.

    `caller_key` is the key that signed the request carrying it, `caller_address` the IP address
    that request came from ("" through a proxy: `messaging.auth.request_peer_address`); None and
    "" for what this hub pulled from its relay (`tier` relay). The tier and trust follow from how
    this hub vouches for the keys (`peer_vouched_tier`), never from the body: a direct call is
    `channel` or `lan` as the caller's key is vouched for, a relay pull is `relay`. A message
    whose origin (or carrier) no one vouched for is at most `unverified` and held for an operator
    (`unknown_peer`). A message whose signature fails names no hub this hub believes: it is kept
    under the calling key."""
    from messaging.services.pipeline import message_send
    from messaging.services.request import Origin, SendRequest

    envelope = _check_envelope(envelope)
    hops = envelope.get("hops", 1)
    if not isinstance(hops, int) or hops < 1 or hops > settings.SWITCHBOARD_MAX_HOPS:
        raise HopLimit(
            f"This message has been forwarded {hops} times; hubs forward a message at most "
            f"{settings.SWITCHBOARD_MAX_HOPS} times.",
        )
    origin = envelope["from"]
    origin_hub = origin["hub"]
    message_id = uuid.UUID(str(envelope["id"]))
    # The origin hub's signature proves who wrote it and for which hub, whoever carried it here;
    # only the origin itself calling earns it receipts straight back, and only at an address this
    # hub holds for its key or the caller's own (`_reply_url`). From the origin (directly or
    # through the relay) it must be signed for this hub; carried onward by another hub, for that
    # hub (which must be vouched for as well). Signed for any other hub, it is a replay: it does
    # not verify here.
    carrier = caller_key if caller_key is not None and caller_key != origin_hub else None
    signed_ok = envelope_verify(envelope, dest_key=carrier or hub_identity().public_key)
    direct = signed_ok and caller_key == origin_hub
    # Whose message this is as far as this hub can tell, and so the key its per-hub records (the
    # contact, stand-ins and their cap, "accepted once") are kept under: the origin when its
    # signature holds; otherwise the calling hub, whose request signature covers the body; for an
    # unsigned message pulled from the relay, one bucket. A forgery never touches the hub it names.
    sender_hub = origin_hub if signed_ok else (caller_key or UNSIGNED_SENDER)
    own_claims = sender_hub == origin_hub  # the body's hub name and URL are the sender's own words
    # A direct call arrives over HTTP: channel or LAN as its key is vouched for (LAN when not).
    tier = (
        FederationTier.RELAY if caller_key is None else (peer_vouched_tier(caller_key) or FederationTier.LAN)
    )
    standings: list[PeerStanding] = []
    if sender_hub != UNSIGNED_SENDER:
        standings.append(
            peer_seen(
                public_key=sender_hub,
                name=str(origin.get("hub_name", "")) if own_claims else "",
                url=str(origin.get("url", "")) if direct else "",
                tier=tier,
            )
        )
    if caller_key is not None and caller_key != sender_hub:
        # Carried onward by another hub (or a forgery it sent): that hub must be one this hub accepts.
        standings.append(peer_seen(public_key=caller_key, tier=tier))
    # Vouched only when the signature holds and every key it rests on is vouched for
    # (`PeerStanding.vouched`: a key revoked with mode hold is not); a hold reason only holds it
    # for an operator, it never vouches. With no key to rest on, it waits as an unknown peer's.
    vouched = signed_ok and bool(standings) and all(s.vouched for s in standings)
    hold_reason = next((s.hold_reason for s in standings if s.hold_reason), "")
    if not standings:
        hold_reason = UNKNOWN_PEER_HOLD
    earlier = _inbound_earlier(sender_hub, message_id)
    if earlier is not None:
        return earlier
    trust = f"{tier}-verified" if vouched else "unverified"
    sender = remote_session_for(
        hub_key=sender_hub,
        hub_name=str(origin.get("hub_name", "")) if own_claims else "",
        remote_id=str(origin.get("id", ""))[:64] or f"name:{origin.get('name', '')}",
        name=str(origin.get("name", "remote"))[:64],
        ref=str(origin.get("ref", ""))[:12],
        capped=True,
    )
    # Urgency is a claim a hub earns by being vouched for; a stranger's message is never urgent.
    claimed = envelope.get("priority")
    priority = claimed if vouched and claimed in ("normal", "urgent") else "normal"
    try:
        with transaction.atomic():
            if hold_reason:
                # Held for an operator because of its key: the key's stand-ins share one bound.
                peer_holds_checked(hub_key=sender_hub)
            outcome = message_send(
                SendRequest(
                    sender=sender,
                    to=envelope["to"],
                    text=envelope["text"],
                    summary=str(envelope.get("summary", ""))[:200],
                    priority=priority,
                    actor=HUB,
                    origin=Origin.forwarded_by(
                        InboundContext(
                            message_id=_local_message_id(message_id),
                            tier=tier,
                            trust=trust,
                            hold_reason=hold_reason,
                            vouched=vouched,
                        ),
                        signature_failed=not signed_ok,
                        attached=envelope_file_heads(envelope),
                    ),
                )
            )
            if not outcome.duplicate:
                # A duplicate (the same sender's same text within the dedupe window) is the message
                # it repeats, with the files that one's signature covered: its own join nothing.
                if outcome.delivery.state == S.HELD and outcome.delivery.hold_reason == STOPPED_HOLD:
                    stopped_holds_checked_for_hub(hub_key=sender_hub, recipient=outcome.recipient)
                files_receive(
                    envelope=envelope,
                    message_id=outcome.message.id,
                    recipient=outcome.recipient,
                    trust=trust,
                )
            InboundMessage.objects.create(
                origin_hub=sender_hub,
                message_id=message_id,
                delivery_id=outcome.delivery.pk,
                tier=tier,
                trust=trust,
                reply_url=_reply_url(
                    origin_hub, claimed=str(origin.get("url", "")), caller_address=caller_address
                )
                if direct
                else "",
                reported_state=outcome.delivery.state,
            )
            if not signed_ok and not outcome.duplicate:
                # One row per message kept, in its transaction: a forgery refused keeps nothing
                # and writes nothing, so the audit grows no faster than the holds it bounds.
                audit_event(
                    "federation.signature_failed",
                    actor="hub",
                    target=sender_hub,
                    detail={"message_id": str(message_id), "tier": tier, "claimed_hub": str(origin_hub)[:64]},
                )
    except IntegrityError:
        earlier = _inbound_earlier(sender_hub, message_id)
        if earlier is not None:
            return earlier
        raise
    except Ambiguous as exc:
        raise ambiguity_for_hub(exc, vouched=vouched) from None
    except PinConflict as exc:
        raise pin_conflict_for_hub(exc, target=envelope["to"], vouched=vouched) from None
    except NotFound as exc:
        # Not here (any more): pass it on within this machine or LAN, one hop further, never back.
        onward = _forward_onward(envelope=envelope, hops=hops, exclude={origin_hub, caller_key or ""})
        if onward is None:
            raise not_found_for_hub(exc, target=envelope["to"], vouched=vouched) from None
        return onward
    from messaging.services.sending import outcome_sentence

    held = outcome.delivery.state == S.HELD
    return InboundResult(
        message_id=str(message_id),
        state=outcome.delivery.state,
        duplicate=outcome.duplicate,
        trust=trust,
        delivery_id=outcome.delivery.pk,
        detail=outcome_sentence(outcome.delivery, outcome.recipient) if held else "",
    )


def _reply_url(origin_hub: str, *, claimed: str, caller_address: str) -> str:
    """Where receipts for a message the origin hub sent here itself go: an address this hub holds
    for that key from a verified source (`hub_urls_verified`; the one the message names when it is
    one of them), else the URL the message names when its host is the very IP address the call
    came from (a hub pinned by key alone); "" otherwise. The URL in the message is the sender's
    word only: any key signs its own envelopes, so taken as it came it would have this hub call
    any address the sender chose; bound to the caller's own address, it reaches nothing the
    caller does not hold."""
    claimed = claimed.rstrip("/")
    verified = hub_urls_verified(origin_hub)
    if claimed in verified:
        return claimed[:512]
    if verified:
        return verified[0][:512]
    return claimed[:512] if _url_at_address(claimed, caller_address) else ""


def _url_at_address(url: str, address: str) -> bool:
    """True when `url` is http(s) to the IP address `address` itself (its host an IP literal;
    an IPv4-mapped one as IPv4). False for no `address` (the call came through a proxy)."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        split = urlsplit(url)
        host = ipaddress.ip_address(split.hostname or "")
        if isinstance(host, ipaddress.IPv6Address) and host.ipv4_mapped is not None:
            host = host.ipv4_mapped
        return split.scheme in ("http", "https") and host == ipaddress.ip_address(address)
    except ValueError:
        return False


def _forward_onward(*, envelope: dict[str, Any], hops: int, exclude: set[str]) -> InboundResult | None:
    """Forward a message this hub does not host to the hub that does (channel, LAN), hops + 1.
    None when the hop cap is reached or no other hub hosts the target."""
    if hops >= settings.SWITCHBOARD_MAX_HOPS:
        return None
    route = route_find(
        target=envelope["to"],
        exclude=exclude | {hub_identity().public_key},
        tiers=(FederationTier.CHANNEL, FederationTier.LAN),
    )
    if route is None:
        return None
    onward = dict(envelope, hops=hops + 1)
    try:
        answer = envelope_send(
            tier=route.tier, url=route.url, hub_key=route.hub_key, envelope=onward, agent=route.name
        )
    except UnverifiedKey:
        return None
    except TransientError as exc:
        raise Unavailable(f"The hub that hosts {envelope['to']!r} did not answer; retry.") from exc
    except PermanentError as exc:
        if exc.status == 404:
            return None
        raise Invalid(
            "onward_refused", f"The hub that hosts {envelope['to']!r} refused it: {_detail(exc.body)}"
        ) from exc
    audit_event(
        "federation.forwarded_onward",
        actor="hub",
        target=route.hub_key,
        detail={"message_id": str(envelope["id"]), "tier": route.tier, "hops": hops + 1},
    )
    answer = answer or {}
    return InboundResult(
        message_id=str(envelope["id"]),
        state=str(answer.get("status", "accepted")),
        duplicate=bool(answer.get("duplicate", False)),
        trust=str(answer.get("trust", "")),
        delivery_id=None,
    )


def _local_message_id(message_id: uuid.UUID) -> uuid.UUID | None:
    """The id a forwarded message takes here: the sending hub's, so both hubs name it alike,
    unless a message here already has it (a local one, or another hub's sent under the same id):
    then a new one. Another hub's choice of id never keeps a message out; receipts still name
    the sending hub's id (`InboundMessage`)."""
    return None if Message.objects.filter(pk=message_id).exists() else message_id


def _inbound_earlier(origin_hub: str, message_id: uuid.UUID) -> InboundResult | None:
    row = InboundMessage.objects.filter(origin_hub=origin_hub, message_id=message_id).first()
    if row is None:
        return None
    state = Delivery.objects.filter(pk=row.delivery_id).values_list("state", flat=True).first() or "unknown"
    return InboundResult(
        message_id=str(message_id), state=state, duplicate=True, trust=row.trust, delivery_id=row.delivery_id
    )


def hosts_answer(*, target: str, vouched: bool) -> dict[str, Any]:
    """Answer another hub's "do you host `target`?" from this hub's live sessions only, as
    `local_address` lets a hub vouched for (or not) learn it."""
    me = hub_identity()
    try:
        found = local_address(target, vouched=vouched)
    except NotFound:
        return {"hosted": False, "hub_key": me.public_key, "hub_name": me.name}
    return {
        "hosted": True,
        "hub_key": me.public_key,
        "hub_name": me.name,
        "id": found.id,
        "name": found.name,
        "ref": found.ref,
    }


def local_address(target: str, *, vouched: bool) -> Candidate:
    """The live local session `target` names, as another hub asking `hosts_answer` may learn of
    it. A hub this hub vouches for reads the directory anyway, so the resolver's full rules answer
    it, a unique prefix included. Any other key is answered only for an address that names a
    session exactly (id, ref, name, `name [ref]`), so it cannot list the agents a prefix at a
    time, and its NotFound names nobody. (A message such a hub sends is held to the same rule by
    the send pipeline's own resolution: `InboundContext.vouched`.)
    Raises NotFound, or Ambiguous as `ambiguity_for_hub` words it."""
    from messaging.services.recipients import find_candidates

    candidates = find_candidates(None, target)  # type: ignore[arg-type]
    local = AgentSession.objects.filter(pk__in=[c.id for c in candidates]).exclude(kind=REMOTE_KIND)
    ids = {str(pk) for pk in local.filter(status__in=LIVE).values_list("pk", flat=True)}
    live = [c for c in candidates if c.id in ids]
    try:
        return resolve(target, live, prefixes=vouched).candidate
    except Ambiguous as exc:
        raise ambiguity_for_hub(exc, vouched=vouched) from None
    except NotFound as exc:
        raise not_found_for_hub(exc, target=target, vouched=vouched) from None


def not_found_for_hub(exc: NotFound, *, target: str, vouched: bool) -> NotFound:
    """An address no session takes, as another hub is told it: as the resolver words it to a hub
    this hub vouches for; to any other key, in words that name nobody (no exited session, no hint)."""
    if vouched:
        return exc
    return NotFound(f"No live session is called {target!r}.")


def ambiguity_for_hub(exc: Ambiguous, *, vouched: bool) -> Ambiguous:
    """An ambiguous address as another hub is told it: the candidates by name, ref and id to a hub
    this hub vouches for (what its directory shows), none to any other key; never a session's
    working folder, which no hub is shown."""
    if not vouched:
        return Ambiguous(exc.detail)
    shown = [{k: c[k] for k in ("name", "ref", "id") if k in c} for c in exc.extra.get("candidates", [])]
    return Ambiguous(exc.detail, candidates=shown)


def pin_conflict_for_hub(exc: PinConflict, *, target: str, vouched: bool) -> PinConflict:
    """A remote sender's pin for a name that now means another session, as its hub is told it:
    both sessions by name, ref and id to a hub this hub vouches for (what its directory shows),
    neither to any other key, which learns only that the name has changed hands; never a
    session's working folder, which no hub is shown."""
    if not vouched:
        return PinConflict(
            f"The name {target!r} now means another session than the one your messages reached "
            "before; nothing was sent. Address the session you mean by its id or as `name [ref]`."
        )
    shown = {
        side: {k: exc.extra[side][k] for k in ("name", "ref", "id") if k in exc.extra[side]}
        for side in ("pinned", "now")
        if isinstance(exc.extra.get(side), dict)
    }
    return PinConflict(exc.detail, **shown)


def local_agents_public(standing: PeerStanding) -> list[dict[str, Any]]:
    """This hub's live agents, as the discovery of a hub it vouches for shows them. A hub on first
    use or revoked (held) gets none: it may ask for one address (`hosts_answer`) to send its first,
    held, message, but not read the directory."""
    if not standing.vouched:
        return []
    rows = AgentSession.objects.filter(status__in=LIVE).exclude(kind=REMOTE_KIND).order_by("name_key")
    return [{"id": str(s.id), "name": s.name, "ref": s.ref, "status": s.status} for s in rows[:1000]]
