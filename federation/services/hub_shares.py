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

from typing import Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from federation.models import Peer, RemoteSession
from messaging.errors import HoldFull
from messaging.hold_reasons import PEER_HOLDS, STOPPED_HOLD
from messaging.models import Delivery
from messaging.states import DeliveryState


def _held_from(hub_key: str) -> QuerySet[Delivery]:
    """The deliveries waiting (held) whose message one of `hub_key`'s stand-ins sent."""
    stand_ins = RemoteSession.objects.filter(hub_key=hub_key).values("session_id")
    return Delivery.objects.filter(state=DeliveryState.HELD, message__sender_id__in=stand_ins)


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


def stopped_holds_checked_for_hub(*, hub_key: str, recipient_id: Any) -> None:
    """After a message from `hub_key` was held for the stopped session `recipient_id` (written in
    the current transaction): raise HoldFull when `hub_key`'s stand-ins together now hold more
    for it than one sender may (SWITCHBOARD_STOPPED_HOLDS_PER_SENDER), or more for stopped
    sessions on this hub (SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB); the caller's transaction
    then keeps nothing. One count, with the key's row locked."""
    _hub_key_lock(hub_key)
    counts = (
        _held_from(hub_key)
        .filter(hold_reason=STOPPED_HOLD)
        .aggregate(hub=Count("id"), recipient=Count("id", filter=Q(recipient_id=recipient_id)))
    )
    if counts["recipient"] > settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER:
        raise HoldFull(
            "The session is stopped and already holds as many messages from your hub as it holds "
            f"from one sender ({settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER}); nothing was kept. "
            "Wait until it starts again.",
        )
    if counts["hub"] > settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB:
        raise HoldFull(
            "This hub already holds as many messages from your hub for stopped sessions as it "
            f"holds from one sender ({settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB}); "
            "nothing was kept. Wait until they start again.",
        )
