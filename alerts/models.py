"""What the operator was told, and what they acknowledged. No message text, ever."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from messaging.models import AgentSession, Delivery


class AlertKind(models.TextChoices):
    ESCALATED_HOLD = "escalated_hold"  # a new hold a human must look at (escalate=required)
    HOLD_EXPIRING = "hold_expiring"  # a hold waiting for an operator, expiring within the lead time
    SESSION_DEAD = "session_dead"  # a running session not heard from past the dead timeout


class AlertState(models.TextChoices):
    PENDING = "pending"  # to be posted (again, after a failure, at next_attempt_at)
    SENT = "sent"  # the webhook took it (2xx)
    FAILED = "failed"  # every attempt failed, or the hub may not call the URL
    SKIPPED = "skipped"  # acknowledged or settled before it was posted


class Alert(models.Model):
    """One thing the operator is told once: a hold (per kind), or a session's one silence.

    The unique constraints are the dedupe: detection inserts ignoring conflicts, so two runs at
    once, or one run repeated, never make a second alert for the same thing."""

    kind = models.CharField(max_length=20, choices=AlertKind.choices)
    # No database constraint and nothing done on delete: retention deletes deliveries in bulk
    # without looking here (an alert outlives its hold by at most KEEP, see alerts.services).
    delivery = models.ForeignKey(
        Delivery,
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=False,
    )
    session = models.ForeignKey(
        AgentSession, null=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    # A dead session's last_seen when the alert was made: heard from again and silent again is a
    # new silence, and a new alert.
    seen = models.DateTimeField(null=True)
    state = models.CharField(max_length=10, choices=AlertState.choices, default=AlertState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True)
    claim = models.UUIDField(null=True)  # the run posting it; a claim lasts until next_attempt_at
    last_error = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True)

    class Meta:
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="alert_due")]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "kind"], condition=Q(delivery__isnull=False), name="alert_once_per_hold"
            ),
            models.UniqueConstraint(
                fields=["session", "kind", "seen"],
                condition=Q(session__isnull=False),
                name="alert_once_per_silence",
            ),
        ]

    def __str__(self) -> str:
        return f"alert {self.kind} {self.delivery_id or self.session_id} ({self.state})"


class Acknowledgement(models.Model):
    """An operator said "I have seen it" about a hold or a session: no more alerts about that hold,
    and none about that session's silence as it was then (see `alerts.services`)."""

    delivery = models.ForeignKey(
        Delivery, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    session = models.ForeignKey(AgentSession, null=True, on_delete=models.CASCADE, related_name="+")
    by = models.CharField(max_length=200)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"acknowledged {self.delivery_id or self.session_id} by {self.by}"
