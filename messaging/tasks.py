"""Celery tasks: tiny, idempotent wrappers that take ids and call a service."""

from __future__ import annotations

from celery import shared_task

from messaging.services.audit import audit_purge_expired
from messaging.services.delivery import deliveries_expire_due
from messaging.services.statistics import planner_statistics_gathered


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


@shared_task(name="messaging.tasks.gather_planner_statistics")
def gather_planner_statistics() -> list[str]:
    """ANALYZE the tables PostgreSQL's planner has no (or, with autovacuum off, stale) figures for."""
    return planner_statistics_gathered()


@shared_task(name="messaging.tasks.purge_audit")
def purge_audit() -> int:
    return audit_purge_expired()


@shared_task(name="messaging.tasks.purge_expired")
def purge_expired() -> int:
    """Messages and exited sessions past their retention (messaging.services.retention)."""
    from messaging.services.retention import retention_purge

    purged = retention_purge()
    return purged.messages + purged.sessions


def socket_retry_delay(attempts: int) -> float | None:
    """Backoff after the `attempts`-th failed socket write (0.5 s, 1 s, 2 s, ...), or None once the
    attempts are used up: the delivery then stays queued for pull and WebSocket push."""
    from django.conf import settings

    if attempts >= settings.SWITCHBOARD_SOCKET_ATTEMPTS:
        return None
    return min(30.0, 0.5 * 2 ** (attempts - 1))


@shared_task(name="messaging.tasks.deliver_to_socket")
def deliver_to_socket(delivery_id: int) -> str:
    """Write one queued delivery to its recipient's Unix socket (`messaging.uds`), then mark it
    delivered. Idempotent: a delivery that is no longer queued, or that another worker holds, is
    skipped; a failed write is retried by `retry_socket_deliveries` with backoff."""
    from messaging.metrics import SOCKET_WRITES

    outcome = _socket_write(delivery_id)
    SOCKET_WRITES.labels(outcome.replace("-", "_")).inc()
    return outcome


def _socket_write(delivery_id: int) -> str:
    from django.conf import settings

    from messaging.framing import frame_for_recipient
    from messaging.principals import HUB
    from messaging.services.delivery import (
        delivery_mark_delivered,
        delivery_socket_claim,
        delivery_socket_failed,
    )
    from messaging.uds import PermanentSocketError, SocketDeliveryError, write_frame

    timeout = float(settings.SWITCHBOARD_SOCKET_TIMEOUT)
    # The lease outlives the write's own timeout, so only a dead worker's claim ever runs out.
    delivery = delivery_socket_claim(delivery_id=delivery_id, lease_seconds=timeout * 2 + 5)
    if delivery is None:
        return "skipped"
    try:
        write_frame(delivery.recipient.peer_address, frame_for_recipient(delivery), timeout=timeout)
    except SocketDeliveryError as exc:
        retry_in = None if isinstance(exc, PermanentSocketError) else socket_retry_delay(delivery.attempts)
        delivery_socket_failed(delivery_id=delivery_id, error=str(exc), retry_in=retry_in)
        return "retry" if retry_in is not None else "left-queued"
    delivery_mark_delivered(delivery_id=delivery_id, actor=HUB, via="uds")
    return "delivered"


@shared_task(name="messaging.tasks.retry_socket_deliveries")
def retry_socket_deliveries() -> int:
    """Start the socket writes whose retry time (or a lost worker's lease) has come."""
    from messaging.jobs import enqueue
    from messaging.services.delivery import deliveries_due_for_socket

    due = deliveries_due_for_socket()
    for delivery_id in due:
        enqueue("messaging.tasks.deliver_to_socket", delivery_id)
    return len(due)
