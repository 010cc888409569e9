"""Agent sessions and everything about one message: the message, its deliveries, pins, audit."""

from __future__ import annotations

import re
import uuid

from django.db import models
from django.db.models import Q

from messaging.states import DeliveryState


class SessionStatus(models.TextChoices):
    BUSY = "busy"
    IDLE = "idle"
    STOPPED = "stopped"
    USER_STOPPED = "user_stopped"
    EXITED = "exited"


# The condition of the live-session indexes, and the same as SQL. A query's own condition must say
# it in the statement's text (not as a parameter) for the database to use those indexes.
LIVE_SESSION = ~models.Q(status=SessionStatus.EXITED)
LIVE_SESSION_SQL = f"NOT (status = '{SessionStatus.EXITED.value}')"


class PermissionMode(models.TextChoices):
    DEFAULT = "default"
    BYPASS = "bypass"


class InboundPolicy(models.TextChoices):
    ACCEPT = "accept"
    HOLD = "hold"
    REFUSE = "refuse"


# Session kinds. A client names its own kind (what runs it: script, listener, claude-code, codex,
# mcp, ...), but the kinds below are the hub's to give: `remote` marks a stand-in for another hub's
# agent, which discovery leaves out and operator isolation holds. A client registering with one of
# them would hide from both, so registration refuses them (`session_kind_problem`).
REMOTE_KIND = "remote"
RESERVED_SESSION_KINDS = frozenset({REMOTE_KIND, "hub", "operator", "relay", "observer", "system"})
# What a client-chosen kind may look like: lower-case ASCII, so no look-alike of a reserved one.
SESSION_KIND_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")


def session_kind_problem(kind: str) -> str | None:
    """Why a client may not register with `kind`, or None when it may."""
    if not SESSION_KIND_PATTERN.fullmatch(kind):
        return "kind is 1 to 32 lower-case letters, digits and . _ - (e.g. script, claude-code)."
    if kind in RESERVED_SESSION_KINDS:
        return f"kind {kind!r} is reserved for sessions the hub makes itself; pick another."
    return None


class AgentSession(models.Model):
    """One registered agent session. Its name is a label (not unique); `ref` is its short handle."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=64)
    name_key = models.CharField(max_length=256, db_index=True, help_text="NFKC + casefold of the name")
    ref = models.CharField(max_length=12, unique=True)
    cwd = models.CharField(max_length=1024, blank=True, default="")
    kind = models.CharField(max_length=32, default="script")
    permission_mode = models.CharField(
        max_length=16, choices=PermissionMode.choices, default=PermissionMode.DEFAULT
    )
    status = models.CharField(
        max_length=16, choices=SessionStatus.choices, default=SessionStatus.IDLE, db_index=True
    )
    peer_address = models.CharField(max_length=1024, blank=True, default="")
    inbound_policy = models.CharField(
        max_length=8,
        choices=InboundPolicy.choices,
        null=True,
        blank=True,
        help_text="None: by permission mode",
    )
    operator_policy = models.CharField(
        max_length=8,
        choices=InboundPolicy.choices,
        null=True,
        blank=True,
        help_text="Set by an operator; the session may only make its own policy stricter than this.",
    )
    hold_expiry_seconds = models.PositiveIntegerField(null=True, blank=True)
    headless = models.BooleanField(default=False)
    sensitive_exempt = models.BooleanField(
        default=False,
        help_text="Set by an operator: sensitive messages from this (verified) sender are not forced into a hold.",
    )
    final_answer = models.TextField(blank=True, default="")
    public_key = models.TextField(blank=True, default="")
    token_hash = models.CharField(max_length=64, unique=True)
    # SHA-256 of the client's registration key: a retried registration with the same key gets this
    # session back (with a new token) instead of a second one. At most one session holds a key; an
    # exited session gives it up to the next registration that sends it.
    registration_key_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(db_index=True)
    status_changed_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at"]
        # Addresses are looked up among live sessions only (`LIVE_SESSION_SQL`). A hub keeps every
        # session it has registered, and a folder's sessions share its name, so exited rows soon
        # outnumber live ones: these indexes hold live sessions alone. The name key's is in byte
        # order on PostgreSQL (pattern ops), for a name prefix as a range whatever the collation.
        indexes = [
            models.Index(
                fields=["name_key"],
                name="session_live_name_key",
                condition=LIVE_SESSION,
                opclasses=["varchar_pattern_ops"],
            ),
            models.Index(fields=["name"], name="session_live_name", condition=LIVE_SESSION),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.ref}]"

    @property
    def label(self) -> str:
        return f"{self.name} [{self.ref}]"


class MessageKind(models.TextChoices):
    TEXT = "text"
    FRAME = "frame"
    OBSERVER_REPORT = "observer_report"
    NOTIFICATION = "notification"


class Tier(models.TextChoices):
    INFO = "info"
    COORD = "coord"
    SENSITIVE = "sensitive"


class Priority(models.IntegerChoices):
    NORMAL = 0, "normal"
    URGENT = 1, "urgent"


class Message(models.Model):
    """What a sender said, once. Who gets it and how far it got lives in `Delivery`."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: `message_sender_recent` (sender, created_at) serves lookups by sender.
    sender = models.ForeignKey(
        AgentSession,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="sent_messages",
        db_index=False,
    )
    kind = models.CharField(max_length=16, choices=MessageKind.choices, default=MessageKind.TEXT)
    frame_type = models.CharField(max_length=32, blank=True, default="")
    text = models.TextField()
    summary = models.CharField(max_length=200, blank=True, default="")
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    tier = models.CharField(max_length=12, choices=Tier.choices, default=Tier.INFO)
    # What made it sensitive: codes of the sensitive tier's rules (`messaging.sensitivity`), space
    # separated, "@summary" / "@file" when not in the text. Never the matched text.
    matched = models.CharField(max_length=500, blank=True, default="")
    priority = models.SmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    trust = models.CharField(max_length=24, default="host-verified")
    to_label = models.CharField(max_length=256, blank=True, default="", help_text="the address as sent")
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)
    request_hash = models.CharField(max_length=64, blank=True, default="")
    # SHA-256 of the sender and the text's SHA-256 (`messaging.services.pair.dedupe_key`), empty
    # for the hub's own messages: what the dedupe rule looks up, by `message_dedupe_key`.
    dedupe_key = models.CharField(max_length=64, blank=True, default="")
    # The sender → recipient pair the message was accepted for (`messaging.services.pair.pair_key`),
    # null for the hub's own messages: what loop protection counts a pair's recent texts by.
    pair_key = models.UUIDField(null=True, blank=True)
    in_reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [
            # Loop protection: identical text from a sender in a short window, and a pair's recent
            # traffic. The dedupe lookup names one column that no other index starts with, so no
            # plan can serve it from `message_sender_recent` by reading every message the sender
            # wrote within the window (whatever the statistics say of the sender).
            models.Index(fields=["dedupe_key", "created_at"], name="message_dedupe_key"),
            # A pair's recent texts, read up to the loop threshold: one index range, however much
            # either side writes to or receives from others.
            models.Index(fields=["pair_key", "created_at"], name="message_pair_recent"),
            models.Index(fields=["sender", "created_at"], name="message_sender_recent"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["sender", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="message_idempotency_key_per_sender",
            )
        ]

    def __str__(self) -> str:
        return f"message {self.id}"


class DeliveryTier(models.TextChoices):
    HOST = "host"
    CHANNEL = "channel"
    LAN = "lan"
    RELAY = "relay"


class Delivery(models.Model):
    """A message on its way to one recipient. Its `state` moves only along `states.TRANSITIONS`."""

    # Neither key has an index of its own (every insert pays for each index): the unique
    # (message, recipient) constraint serves lookups by message, `delivery_inbox` by recipient.
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="deliveries", db_index=False)
    recipient = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    state = models.CharField(max_length=12, choices=DeliveryState.choices, default=DeliveryState.ACCEPTED)
    tier = models.CharField(max_length=12, choices=DeliveryTier.choices, default=DeliveryTier.HOST)
    priority = models.SmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    hold_reason = models.CharField(max_length=32, blank=True, default="")
    escalate = models.CharField(max_length=12, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # While a socket write of it is under way: when that write's lease runs out (by then the write
    # is over, done or lost with its worker). A recipient's exit leaves such a delivery to its write.
    writing_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    decided_by = models.CharField(max_length=200, blank=True, default="")
    decision_reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    held_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    relayed_at = models.DateTimeField(null=True, blank=True)
    final_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        indexes = [
            # The inbox read: a recipient's queued deliveries, urgent first, oldest first.
            models.Index(fields=["recipient", "state", "-priority", "id"], name="delivery_inbox"),
            # The hold sweeper: due holds by deadline.
            models.Index(fields=["state", "expires_at"], name="delivery_due"),
            models.Index(fields=["state", "next_attempt_at"], name="delivery_retry"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["message", "recipient"], name="delivery_once_per_recipient")
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} ({self.state})"


class UnreadCount(models.Model):
    """How many of a recipient's deliveries are queued or delivered (not yet read): what the unread
    cap checks on every send, kept by database triggers on the delivery table (migration 0004) so a
    send reads a few rows however long the inbox is. PostgreSQL spreads a recipient's count over a
    few `stripe` rows, one per group of connections, so concurrent sends to one recipient do not
    wait on one row; the count is the sum of them. Written only by the triggers."""

    pk = models.CompositePrimaryKey("recipient", "stripe")
    # No database constraint: a delivery deleted with its recipient may touch the count after it.
    recipient = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, db_constraint=False, db_index=False, related_name="+"
    )
    stripe = models.SmallIntegerField()
    n = models.IntegerField()

    def __str__(self) -> str:
        return f"unread {self.recipient_id}/{self.stripe}: {self.n}"


class UnreadShare(models.Model):
    """How many of a recipient's unread deliveries (queued or delivered) come from one sender: what
    bounds one sender's share of the recipient's unread cap on every send, kept by database triggers
    on the delivery table (migration 0011) with the sender read from the delivery's message, striped
    on PostgreSQL as `UnreadCount` is. The sender is the session told of the delivery's moves
    (migration 0012, `messaging.services.delivery.told_of_moves`): messages with no sender (the
    hub's notices) and notices the hub wrote about a session to its subscribers are not counted.
    Written only by the triggers."""

    pk = models.CompositePrimaryKey("recipient", "sender", "stripe")
    # No database constraints, as `UnreadCount`: a delivery deleted with either session may touch
    # the count after it.
    recipient = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, db_constraint=False, db_index=False, related_name="+"
    )
    sender = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, db_constraint=False, db_index=False, related_name="+"
    )
    stripe = models.SmallIntegerField()
    n = models.IntegerField()

    def __str__(self) -> str:
        return f"unread {self.sender_id} -> {self.recipient_id}/{self.stripe}: {self.n}"


class Pin(models.Model):
    """Once a sender has reached a name, that name stays bound to that recipient for that sender."""

    sender = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="pins")
    name_key = models.CharField(max_length=256)
    recipient = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="pinned_by")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sender", "name_key"], name="pin_once_per_name")]

    def __str__(self) -> str:
        return f"pin {self.name_key} -> {self.recipient_id}"


class SenderPolicy(models.Model):
    """A recipient's rule for one sender, overriding its general inbound policy."""

    recipient = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="sender_policies")
    sender = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=8, choices=InboundPolicy.choices)
    set_by = models.CharField(max_length=200, default="")
    by_operator = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "sender policies"
        constraints = [
            models.UniqueConstraint(fields=["recipient", "sender"], name="sender_policy_once_per_pair")
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.sender_id} -> {self.recipient_id}"


class OperatorToken(models.Model):
    """A bearer token that acts as a human operator (approve holds, set policy). Stored hashed."""

    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"operator token {self.name}"


class AuditEvent(models.Model):
    """One change, who made it and to what. Lengths and hashes only: never message text."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=48, db_index=True)
    actor = models.CharField(max_length=200)
    target = models.CharField(max_length=200, blank=True, default="")
    message_id = models.UUIDField(null=True, blank=True, db_index=True)
    delivery_id = models.BigIntegerField(null=True, blank=True)
    length = models.PositiveIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor}"
