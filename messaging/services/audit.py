"""Audit: one event per change, with lengths and hashes and never message text."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from messaging.models import AuditEvent, Message
from messaging.services.bulk import bulk_insert


def audit_event(
    kind: str,
    *,
    actor: str,
    target: str = "",
    message: Message | None = None,
    delivery_id: int | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Record one event. Pass the message to record its id, length and SHA-256 (not its text)."""
    return AuditEvent.objects.create(**_fields(kind, actor, target, message, delivery_id, detail))


def audit_events_bulk(rows: list[dict[str, Any]]) -> list[AuditEvent]:
    """Record many events in one statement; each row takes the keyword arguments of `audit_event`."""
    return AuditEvent.objects.bulk_create([AuditEvent(**_row_fields(row)) for row in rows])


def audit_events_write(rows: list[dict[str, Any]], *, at: datetime | None = None) -> None:
    """`audit_events_bulk` for many events at once (a batch send's) when no AuditEvent objects are
    needed back: one INSERT, with little work per row (`messaging.services.bulk`). `at`: when the
    events happened (default: now)."""
    bulk_insert(model=AuditEvent, rows=audit_rows(rows, at=at))


def audit_rows(rows: list[dict[str, Any]], *, at: datetime | None = None) -> list[dict[str, Any]]:
    """The AuditEvent rows `audit_events_write` inserts for `rows`, as `bulk_insert` takes them."""
    when = str(at or timezone.now())  # as text once, not once per row
    written = []
    for row in rows:
        fields = {"at": when, "length": None, "sha256": "", **_row_fields(row)}
        if isinstance(fields["message_id"], uuid.UUID):
            fields["message_id"] = fields["message_id"].hex
        written.append(fields)
    return written


def _row_fields(row: dict[str, Any]) -> dict[str, Any]:
    return _fields(
        row["kind"],
        row["actor"],
        row.get("target", ""),
        row.get("message"),
        row.get("delivery_id"),
        row.get("detail"),
        row.get("message_id"),
    )


def _fields(
    kind: str,
    actor: str,
    target: str,
    message: Message | None,
    delivery_id: int | None,
    detail: dict[str, Any] | None,
    message_id: Any = None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "kind": kind,
        "actor": actor,
        "target": target,
        "delivery_id": delivery_id,
        "detail": detail or {},
        "message_id": message_id,
    }
    if message is not None:
        fields.update(message_id=message.id, length=message.size, sha256=message.sha256)
    return fields


def audit_purge_expired(*, now: Any = None) -> int:
    """Delete audit events older than the retention setting. Returns how many went."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.SWITCHBOARD_AUDIT_RETENTION_DAYS)
    deleted, _ = AuditEvent.objects.filter(at__lt=cutoff).delete()
    return deleted
