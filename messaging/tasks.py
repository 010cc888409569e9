"""Celery tasks: tiny, idempotent wrappers that take ids and call a service."""

from __future__ import annotations

from celery import shared_task

from messaging.services.audit import audit_purge_expired
from messaging.services.delivery import deliveries_expire_due


@shared_task(name="messaging.tasks.sweep_due_deliveries")
def sweep_due_deliveries() -> int:
    """Expire holds past their deadline (database clock), in batches until none are due."""
    total = 0
    for _ in range(100):
        moved = deliveries_expire_due()
        total += len(moved)
        if len(moved) < 1000:
            break
    return total


@shared_task(name="messaging.tasks.purge_audit")
def purge_audit() -> int:
    return audit_purge_expired()


@shared_task(name="messaging.tasks.deliver_to_socket", bind=True, max_retries=5)
def deliver_to_socket(self, delivery_id: int) -> str:  # type: ignore[no-untyped-def]
    """Write one queued delivery to its recipient's Unix socket (see messaging.transports)."""
    return "not-configured"
