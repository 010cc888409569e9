"""Receipts: the receiving hub tells the sending hub how far a forwarded message got, so the
sender sees delivered / read (or refused, expired) across hubs.

The receiving hub compares each inbound message's delivery state with the state it last reported
and sends the changes, to origin hubs it vouches for only: straight back to an address it holds for
the origin's key (channel, LAN; the request's signature names both hubs), or through the relay,
signed for the origin hub and sealed to it. A hub nobody vouched for gets none: a batch for it
would wait at the relay under this hub's key, unpulled, and count against its quota. The sending hub
moves its own `relayed` delivery accordingly, for messages it forwarded to the reporting hub only,
and shows the far side's state (`remote_state`) only ever moving forward in the delivery state
order (`messaging.states`): receipts that arrive out of order never take it back.
"""

from __future__ import annotations

import base64
import json
import logging
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from federation.errors import PermanentError, TransientError
from federation.models import FederationTier, InboundMessage, RemoteDelivery
from federation.services.keys import receipt_rejected_record, relay_key
from federation.services.peers import peer_vouched
from federation.services.signatures import receipt_batch_problem, receipt_batch_sign
from federation.transport import hub_call, hub_json
from messaging.models import Delivery
from messaging.principals import HUB
from messaging.services.delivery import delivery_transition
from messaging.states import FINAL_STATES, DeliveryState, states_before

log = logging.getLogger(__name__)
S = DeliveryState
# What a remote state means for the sender's own delivery (states absent here only get recorded).
RECEIPT_MOVES = {
    S.DELIVERED: S.DELIVERED,
    S.READ: S.READ,
    S.REFUSED: S.FAILED,
    S.DENIED: S.FAILED,
    S.EXPIRED: S.FAILED,
    S.FAILED: S.FAILED,
}
# Receipts in one flush, all origins together: so one batch through the relay carries at most this
# many, which bounds its sealed size (SWITCHBOARD_RELAY_RECEIPT_MAX_BYTES on the relay).
RECEIPTS_PER_BATCH = 500


def receipt_apply_local(*, delivery_id: int, state: str, reason: str = "") -> bool:
    """Record that the far side reached `state`; move the local delivery when that means something.
    Returns True when the local delivery moved.

    The far side's state is recorded only when it moves forward: `state` must come after the one
    shown (`messaging.states.states_before`), or the one shown must be this hub's own word for a
    message still on its way (pending, retry, at_relay: no delivery state, so before them all). So
    a receipt made before the one already applied (two batches through the relay, pulled in the
    other order) changes nothing, and neither does a state no delivery has. The local delivery
    moves by its own conditional update on the same table, which never goes back either."""
    with transaction.atomic():
        if state in S.values:
            RemoteDelivery.objects.filter(delivery_id=delivery_id).filter(
                Q(remote_state__in=states_before(state)) | ~Q(remote_state__in=S.values)
            ).update(remote_state=state)
        target = RECEIPT_MOVES.get(state)
        if target is None:
            return False
        said = f"the other hub reports {state}" + (f" ({reason})" if reason and target == S.FAILED else "")
        moved = delivery_transition(
            Delivery.objects.filter(pk=delivery_id),
            to=target,
            actor=HUB,
            reason=said,
            # A failure is the sender's to read in its delivery, as one this hub decided is.
            updates={"decision_reason": said[:500]} if target == S.FAILED else None,
        )
        if not moved and target == S.READ:
            # relayed → read is legal; delivered → read too; anything else stays as it is.
            return False
        return bool(moved)


def receipts_from_hub(*, hub_key: str, receipts: list[dict[str, Any]]) -> int:
    """Apply receipts sent by the hub holding `hub_key` (only for messages forwarded to it)."""
    applied = 0
    for receipt in receipts[:1000]:
        if not isinstance(receipt, dict):
            continue
        rd = (
            RemoteDelivery.objects.filter(
                message_id=str(receipt.get("message_id", "")), hub_key=hub_key
            ).first()
            if _is_uuid(receipt.get("message_id"))
            else None
        )
        if rd is None:
            continue
        state = str(receipt.get("state", ""))
        if state == S.READ:
            # A message may be read before we heard it was delivered: pass through delivered.
            receipt_apply_local(delivery_id=rd.delivery_id, state=S.DELIVERED)
        if receipt_apply_local(
            delivery_id=rd.delivery_id, state=state, reason=str(receipt.get("reason", ""))[:200]
        ):
            applied += 1
    return applied


def _is_uuid(value: Any) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
        return True
    except ValueError:
        return False


def receipts_pending(*, batch: int = RECEIPTS_PER_BATCH) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Inbound messages whose delivery state changed since the last receipt, by (origin, route)."""
    from federation.services.forwarding import UNSIGNED_SENDER

    # Receipts are worth sending for a week; after that the sender's side has long given up waiting.
    since = timezone.now() - timedelta(days=7)
    rows = list(
        InboundMessage.objects.filter(created_at__gte=since)
        .exclude(reported_state__in=FINAL_STATES)
        .order_by("id")[: batch * 4]
    )

    states = dict(
        Delivery.objects.filter(pk__in=[r.delivery_id for r in rows if r.delivery_id]).values_list(
            "id", "state"
        )
    )
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    vouched: dict[str, bool] = {}
    for row in rows:
        state = states.get(row.delivery_id)
        if state is None or state == row.reported_state:
            continue
        if row.origin_hub not in vouched:
            vouched[row.origin_hub] = row.origin_hub != UNSIGNED_SENDER and peer_vouched(row.origin_hub)
        if not vouched[row.origin_hub] or (not row.reply_url and row.tier != FederationTier.RELAY):
            # Nobody to tell: no proven way back (the signature failed, or no address this hub
            # holds for the key), or a hub this hub does not vouch for. A batch for a stranger's
            # key would wait at the relay under this hub's key, unpulled, counting against its
            # quota there, so receipts go to vouched hubs only.
            InboundMessage.objects.filter(pk=row.pk).update(reported_state=state)
            continue
        route = row.reply_url or "relay"
        out[(row.origin_hub, route)].append(
            {"message_id": str(row.message_id), "state": state, "_row": row.pk}
        )
        if sum(len(v) for v in out.values()) >= batch:
            break
    return out


def receipts_flush() -> int:
    """Send every pending receipt; a receipt that could not be sent is tried again next time."""
    sent = 0
    for (origin_hub, route), items in receipts_pending().items():
        body = [{k: v for k, v in item.items() if k != "_row"} for item in items]
        try:
            if route == "relay":
                if not settings.SWITCHBOARD_RELAY_URL:
                    continue
                sealed = receipts_sealed_for_relay(origin_hub=origin_hub, receipts=body)
                for item in body:
                    hub_call(
                        "POST",
                        settings.SWITCHBOARD_RELAY_URL,
                        "/relay/messages",
                        {
                            "kind": "receipt",
                            "message_id": item["message_id"],
                            "dest_hub": origin_hub,
                            "agent": "",
                            "sealed": base64.b64encode(sealed).decode("ascii"),
                            "replace": True,
                        },
                        dest_key=relay_key(),
                    )
                    break  # one sealed batch carries every receipt for this origin
            else:
                # `route` is a URL only the origin hub itself proved (it called from its key).
                hub_call("POST", route, "/federation/receipts", {"receipts": body}, dest_key=origin_hub)
        except (TransientError, PermanentError) as exc:
            log.info("receipts to %s not sent yet: %s", route, exc)
            continue
        for item in items:
            InboundMessage.objects.filter(pk=item["_row"]).update(reported_state=item["state"])
        sent += len(items)
    return sent


def receipts_sealed_for_relay(*, origin_hub: str, receipts: list[dict[str, Any]]) -> bytes:
    """One receipt batch as it travels through the relay: signed by this hub for the origin hub
    (`receipt_batch_sign`: who reports, to whom, on what), sealed to that hub
    (`receipts_open_relayed` opens it there)."""
    from federation.services.forwarding import seal_for_hub

    batch = receipt_batch_sign(receipts=receipts, dest_key=origin_hub)
    return seal_for_hub(hub_key=origin_hub, payload=json.dumps(batch, separators=(",", ":")).encode("utf-8"))


def receipts_open_relayed(*, payload: bytes) -> int:
    """Apply a receipt batch pulled from the relay (after unsealing) when the hub it names signed
    it for this hub (`receipt_batch_problem`). Anything else is refused and audited: a batch made
    for another hub (passed on by the hub it was for, or by a relay that could open it) would
    otherwise move this hub's deliveries for messages that share its ids. The refusals are
    audited once per relay per 10 minutes (`keys.receipt_rejected_record`): whoever stores
    batches for this hub there chooses how many fail."""
    from federation.services.identity import hub_identity

    try:
        data = hub_json(payload)
    except (ValueError, RecursionError):
        return 0
    if not isinstance(data, dict):
        return 0
    hub_key = str(data.get("hub", ""))[:64]
    problem = receipt_batch_problem(data, dest_key=hub_identity().public_key)
    if problem is not None:
        receipt_rejected_record(relay=settings.SWITCHBOARD_RELAY_URL, hub_key=hub_key, problem=problem)
        return 0
    receipts = data.get("receipts")
    return receipts_from_hub(hub_key=hub_key, receipts=receipts if isinstance(receipts, list) else [])


def remote_progress(*, delivery_ids: list[int]) -> dict[int, dict[str, Any]]:
    """For deliveries handed to other hubs: the tier, the hub and what it last reported
    (`pending`, `retry`, `at_relay`, `queued`, `held`, `delivered`, ...)."""
    from federation.models import RemoteSession

    rows = list(RemoteDelivery.objects.filter(delivery_id__in=delivery_ids))
    names = dict(
        RemoteSession.objects.filter(hub_key__in=[r.hub_key for r in rows]).values_list("hub_key", "hub_name")
    )
    return {
        r.delivery_id: {
            "tier": r.tier,
            "hub": names.get(r.hub_key, ""),
            "hub_key": r.hub_key,
            "remote_state": r.remote_state,
            "attempts": r.attempts,
            "last_error": r.last_error or None,
        }
        for r in rows
    }
