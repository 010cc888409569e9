"""`notify_when_idle`: tell a subscriber once, at the target's next idle or exit.

It fires once; immediately if the target is idle (or gone) already; it lapses after
SWITCHBOARD_IDLE_SUBSCRIPTION_SECONDS (12 h). Subscribing sends nothing to the target, so it
never wakes it or costs it a turn. Any session may subscribe, but the notice carries the target's
final answer only to a reader `final_answer_allowed` accepts (its lead, its teammates, a watcher it
or an operator allowed); others learn only that it is idle. A subscriber keeps at most
SWITCHBOARD_SUBSCRIPTIONS_PER_SESSION waiting subscriptions (`409 too_many_subscriptions`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from messaging.errors import Conflict, Forbidden, Invalid, NotFound
from messaging.models import AgentSession, SessionStatus
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.states import DeliveryState
from teams.models import Observer, Subscription, SubscriptionState
from teams.services.notify import clip, notify_safely
from teams.services.watchers import final_answer_allowed


def subscription_create(*, subscriber: AgentSession, target: AgentSession, actor: Principal) -> Subscription:
    """Subscribe to `target`'s next idle or exit. An existing waiting subscription is returned as is."""
    if subscriber.id == target.id:
        raise Invalid("self_target", "A session cannot wait for itself to go idle.")
    if Observer.objects.filter(session=subscriber).exists():
        raise Forbidden("Observers receive nothing, so they cannot subscribe.", reason="observer")
    now = timezone.now()
    existing = Subscription.objects.filter(
        subscriber=subscriber, target=target, state=SubscriptionState.WAITING, expires_at__gt=now
    ).first()
    if existing is not None:
        return existing
    told = _told_and_unread(subscriber=subscriber, target=target)
    if told is not None:
        return told
    subscriptions_lapse_due(now=now)
    waiting = Subscription.objects.filter(
        subscriber=subscriber, state=SubscriptionState.WAITING, expires_at__gt=now
    ).count()
    if waiting >= settings.SWITCHBOARD_SUBSCRIPTIONS_PER_SESSION:
        raise Conflict(
            f"You already wait on {waiting} sessions (the limit is "
            f"{settings.SWITCHBOARD_SUBSCRIPTIONS_PER_SESSION}). Cancel one you no longer need "
            "(DELETE /api/v1/teams/subscriptions/{id}) or wait until some fire.",
            reason="too_many_subscriptions",
        )
    try:
        with transaction.atomic():
            sub = Subscription.objects.create(
                subscriber=subscriber,
                target=target,
                expires_at=now + timedelta(seconds=settings.SWITCHBOARD_IDLE_SUBSCRIPTION_SECONDS),
            )
            audit_event(
                "subscription.created",
                actor=actor.actor,
                target=str(target.id),
                detail={"subscription": sub.pk},
            )
            state = AgentSession.objects.values_list("status", flat=True).get(pk=target.pk)
            if state == SessionStatus.IDLE:
                _fire(sub, target, on="idle")
            elif state == SessionStatus.EXITED:
                _fire(sub, target, on="exited")
    except IntegrityError:
        found = Subscription.objects.filter(
            subscriber=subscriber, target=target, state=SubscriptionState.WAITING
        ).first()
        if found is None:
            raise
        return found
    sub.refresh_from_db()
    return sub


def _told_and_unread(*, subscriber: AgentSession, target: AgentSession) -> Subscription | None:
    """The subscription that already told `subscriber` about `target`, while that notice is still
    unread: subscribing again to an idle target then adds nothing (no new row, no new notice)."""
    return (
        Subscription.objects.filter(
            subscriber=subscriber,
            target=target,
            state=SubscriptionState.FIRED,
            notification__deliveries__recipient=subscriber,
            notification__deliveries__state__in=[DeliveryState.QUEUED, DeliveryState.HELD],
        )
        .order_by("-fired_at")
        .first()
    )


def subscriptions_fire(*, target: AgentSession, on: str) -> int:
    """Fire every waiting, unexpired subscription on `target` (called inside the status change)."""
    now = timezone.now()
    fired = 0
    for sub in Subscription.objects.filter(
        target=target, state=SubscriptionState.WAITING, expires_at__gt=now
    ).select_related("subscriber"):
        fired += _fire(sub, target, on=on)
    return fired


def _fire(sub: Subscription, target: AgentSession, *, on: str) -> int:
    now = timezone.now()
    with transaction.atomic():
        if not Subscription.objects.filter(pk=sub.pk, state=SubscriptionState.WAITING).update(
            state=SubscriptionState.FIRED, fired_at=now, fired_on=on
        ):
            return 0  # fired already (twice is never)
        answer, _ = clip(target.final_answer or "")
        if on == "idle" and not final_answer_allowed(reader=sub.subscriber, target=target):
            text = (
                f"{target.label} is idle now. Its final answer goes only to its lead, its teammates and "
                "the watchers it allowed; ask it (or an operator) to allow you (POST /api/v1/teams/watchers)."
            )
        elif on == "idle":
            text = f"{target.label} is idle now." + (
                f" Its last final answer:\n\n{answer}" if answer else " It reported no final answer."
            )
        else:
            text = f"{target.label} has exited; it will not go idle again."
        outcome = notify_safely(
            sender=target,
            recipient=sub.subscriber,
            text=text,
            summary=f"{target.name} is {'idle' if on == 'idle' else 'gone'}",
            notice="subscription",
        )
        if outcome is not None:
            Subscription.objects.filter(pk=sub.pk).update(notification=outcome.message)
        audit_event(
            "subscription.fired",
            actor="hub",
            target=str(sub.subscriber_id),
            detail={"subscription": sub.pk, "on": on, "target": str(target.id)},
        )
    return 1


def subscriptions_lapse_due(*, now: Any = None) -> int:
    """Lapse waiting subscriptions older than their 12 h window (they never fire afterwards)."""
    now = now or timezone.now()
    ids = list(
        Subscription.objects.filter(state=SubscriptionState.WAITING, expires_at__lte=now).values_list(
            "id", flat=True
        )[:1000]
    )
    if not ids:
        return 0
    with transaction.atomic():
        count = Subscription.objects.filter(pk__in=ids, state=SubscriptionState.WAITING).update(
            state=SubscriptionState.LAPSED
        )
        audit_event("subscription.lapsed", actor="hub", detail={"count": count})
    return count


def subscription_cancel(*, subscription_id: Any, actor: Principal) -> Subscription:
    """The subscriber withdraws a waiting subscription."""
    session = actor.require_session()
    try:
        sub = Subscription.objects.get(pk=int(subscription_id), subscriber=session)
    except (Subscription.DoesNotExist, ValueError, TypeError) as exc:
        raise NotFound("No such subscription of yours.") from exc
    with transaction.atomic():
        if Subscription.objects.filter(pk=sub.pk, state=SubscriptionState.WAITING).update(
            state=SubscriptionState.LAPSED
        ):
            audit_event("subscription.cancelled", actor=actor.actor, target=str(sub.target_id))
    sub.refresh_from_db()
    return sub


def subscription_summary(sub: Subscription) -> dict[str, Any]:
    return {
        "id": sub.pk,
        "subscriber": str(sub.subscriber_id),
        "target": str(sub.target_id),
        "state": sub.state,
        "created_at": sub.created_at.isoformat() if sub.created_at else None,
        "expires_at": sub.expires_at.isoformat() if sub.expires_at else None,
        "fired_at": sub.fired_at.isoformat() if sub.fired_at else None,
        "fired_on": sub.fired_on or None,
        "notification_id": str(sub.notification_id) if sub.notification_id else None,
        # Whether its notice carries the target's final answer (decided again when it fires).
        "final_answer": final_answer_allowed(reader=sub.subscriber, target=sub.target),
    }
