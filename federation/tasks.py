"""Celery tasks for federation: tiny, idempotent wrappers that take ids and call a service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from federation.services.forwarding import forward_attempt, forwards_due, forwards_expire_unclaimed
from federation.services.receipts import receipts_flush
from federation.services.registry import registry_refresh, registry_remove_stale
from federation.services.relay import live_session_names, relay_expire, relay_pull_once
from messaging.jobs import enqueue


@shared_task(name="federation.tasks.forward_delivery")
def forward_delivery(delivery_id: int) -> str:
    """Carry one remote delivery to its hub or the relay (retries are scheduled, not raised)."""
    return forward_attempt(delivery_id=delivery_id)


@shared_task(name="federation.tasks.retry_forwards")
def retry_forwards() -> int:
    """Start the forwards whose backoff has run out; give up on relay messages nobody pulled."""
    forwards_expire_unclaimed()
    due = forwards_due()
    for delivery_id in due:
        forward_attempt(delivery_id=delivery_id)
    return len(due)


@shared_task(name="federation.tasks.send_receipts")
def send_receipts() -> int:
    """Tell origin hubs how far their messages got here."""
    return receipts_flush()


@shared_task(name="federation.tasks.relay_pull")
def relay_pull() -> dict[str, int]:
    """Renew this hub's relay leases and pull what waits for its live agents."""
    return relay_pull_once()


@shared_task(name="federation.tasks.registry_refresh")
def refresh_registry() -> int:
    """Keep this hub's registry entries fresh and drop other hubs' stale ones."""
    registry_refresh(live_sessions=live_session_names())
    return registry_remove_stale()


@shared_task(name="federation.tasks.remote_sessions_prune")
def prune_remote_sessions() -> int:
    """Delete stand-ins for remote senders that nothing refers to and nobody used lately, then
    the contact records of keys nobody vouched for that have none left."""
    from federation.services.forwarding import remote_sessions_prune
    from federation.services.peers import peers_unvouched_prune

    return remote_sessions_prune() + peers_unvouched_prune()


@shared_task(name="federation.tasks.relay_cleanup")
def relay_cleanup() -> int:
    """Relay role: drop expired and delivered messages and lapsed leases."""
    if settings.SWITCHBOARD_ROLE != "relay":
        return 0
    return relay_expire()


@shared_task(name="federation.tasks.nonces_prune")
def prune_nonces() -> int:
    """Forget request nonces too old to matter (their requests would be refused as stale)."""
    from federation.services.signatures import nonces_prune

    return nonces_prune()


@shared_task(name="federation.tasks.files_cleanup")
def files_cleanup() -> int:
    """Remove stored files no message uses, once their grace period has passed."""
    from federation.services.files import files_orphans_remove

    return files_orphans_remove()


@shared_task(name="federation.tasks.relay_lease_drop")
def relay_lease_drop_task(name: str) -> None:
    from federation.services.relay import relay_lease_drop

    relay_lease_drop(name=name)


__all__ = ["enqueue"]
