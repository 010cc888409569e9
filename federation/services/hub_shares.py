"""What one calling hub key may take of this hub's room for held messages: its stand-ins counted
together, as one sender.

Every sender id another hub names gets a stand-in session (`forwarding.remote_session_for`, up to
SWITCHBOARD_REMOTE_SESSIONS_PER_PEER per hub key), and the send pipeline counts each stand-in as
a sender of its own. The shares a sender has of the caps on held messages are therefore checked
again here, on the inbound path, for the hub key as a whole (`RemoteSession.hub_key`), so one key
naming many sender ids never gets many senders' shares:

- the holds a key nobody vouched for (first use, or revoked with mode hold) has waiting for an
  operator, whichever recipients they are for: at most SWITCHBOARD_PEER_HOLDS_PER_KEY, so one key
  made at home can neither fill a recipient's room for such holds alone nor the operator's list;
- the holds a key has waiting for stopped sessions: one sender's share of a recipient's room
  (SWITCHBOARD_STOPPED_HOLDS_PER_SENDER) and of the hub's (SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB).

Each check runs inside the transaction that writes the message, with the key's row locked
(`federation_peer`), so messages of one key arriving at once cannot pass a count together. Local
sends never come here: their cost is unchanged.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Q, QuerySet

from federation.models import Peer, RemoteSession
from messaging.errors import HoldFull
from messaging.hold_reasons import PEER_HOLDS
from messaging.models import AgentSession, Delivery
from messaging.services.sending import stopped_holds_checked
from messaging.states import DeliveryState


def _sent_by(hub_key: str) -> Q:
    """The deliveries whose message one of `hub_key`'s stand-ins sent."""
    return Q(message__sender_id__in=RemoteSession.objects.filter(hub_key=hub_key).values("session_id"))


def _held_from(hub_key: str) -> QuerySet[Delivery]:
    """The deliveries waiting (held) whose message one of `hub_key`'s stand-ins sent."""
    return Delivery.objects.filter(_sent_by(hub_key), state=DeliveryState.HELD)


def _hub_key_lock(hub_key: str) -> None:
    """Lock `hub_key`'s row until the transaction ends: one key's messages are counted one at a
    time (a key with no row, the relay's `unsigned` bucket, comes from one pulling process)."""
    list(Peer.objects.select_for_update().filter(public_key=hub_key).values_list("pk", flat=True))


def peer_holds_checked(*, hub_key: str) -> None:
    """Before holding one more message for an operator because of the hub key it comes from
    (`PEER_HOLDS`): raise HoldFull when `hub_key`'s stand-ins together have
    SWITCHBOARD_PEER_HOLDS_PER_KEY such holds waiting, whichever recipients they are for.
    Runs inside the transaction that writes the message."""
    _hub_key_lock(hub_key)
    cap = settings.SWITCHBOARD_PEER_HOLDS_PER_KEY
    if _held_from(hub_key).filter(hold_reason__in=PEER_HOLDS)[:cap].count() >= cap:
        raise HoldFull(
            f"This hub already holds {cap} messages from your hub for an operator, as many as it "
            "holds for one hub it does not vouch for; nothing was kept. Wait until an operator has "
            "decided them (or pinned your hub's key), then send again.",
        )


def stopped_holds_checked_for_hub(*, hub_key: str, recipient: AgentSession) -> None:
    """After a message from `hub_key` was held for the stopped session `recipient` (written in the
    current transaction): raise HoldFull when `hub_key`'s stand-ins together now hold more than
    one sender may, for it or for stopped sessions on this hub (messaging's
    `stopped_holds_checked`, over all of the key's stand-ins); the caller's transaction then keeps
    nothing. Counted with the key's row locked."""
    _hub_key_lock(hub_key)
    stopped_holds_checked(recipient, whose=_sent_by(hub_key), yours="your hub's", written=True)
