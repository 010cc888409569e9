"""Other hubs and what travels between them: peers, remote sessions, forwarded and inbound
messages, relay storage (ciphertext only), relay leases, and content-addressed attachments."""

from __future__ import annotations

import uuid

from django.db import models


class FederationTier(models.TextChoices):
    CHANNEL = "channel"
    LAN = "lan"
    RELAY = "relay"


class RevocationMode(models.TextChoices):
    REFUSE = "refuse"
    HOLD = "hold"


class Peer(models.Model):
    """Another hub, known by its Ed25519 public key. First contact records the key (trust on first
    use) unless an operator pinned it; a revoked peer's messages are refused or held."""

    public_key = models.CharField(max_length=64, unique=True, help_text="Ed25519, base64")
    name = models.CharField(max_length=128, blank=True, default="")
    url = models.CharField(max_length=512, blank=True, default="")
    tier = models.CharField(max_length=8, choices=FederationTier.choices, default=FederationTier.LAN)
    pinned = models.BooleanField(default=False, help_text="an operator vouched for this key")
    revoked = models.BooleanField(default=False)
    revocation_mode = models.CharField(
        max_length=8, choices=RevocationMode.choices, default=RevocationMode.REFUSE
    )
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"peer {self.name or self.public_key[:12]}"


class RemoteSession(models.Model):
    """A local stand-in (an exited, token-less AgentSession) for an agent on another hub, so a
    message and its delivery can name it. Never resolvable as a local recipient."""

    session = models.OneToOneField("messaging.AgentSession", on_delete=models.CASCADE, related_name="+")
    hub_key = models.CharField(max_length=64)
    hub_name = models.CharField(max_length=128, blank=True, default="")
    remote_id = models.CharField(max_length=64)
    remote_name = models.CharField(max_length=64)
    remote_ref = models.CharField(max_length=12, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hub_key", "remote_id"], name="remote_session_once_per_hub")
        ]

    def __str__(self) -> str:
        return f"{self.remote_name} @ {self.hub_name or self.hub_key[:12]}"


class SessionIsolation(models.Model):
    """An operator's mark on one session: hold every message it sends off this machine."""

    session_id = models.UUIDField(unique=True)
    set_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"isolated {self.session_id}"


class RemoteDelivery(models.Model):
    """The far side of a `messaging.Delivery` handed to another hub: where it went and how far."""

    delivery_id = models.BigIntegerField(unique=True)
    message_id = models.UUIDField(db_index=True)
    tier = models.CharField(max_length=8, choices=FederationTier.choices)
    target = models.CharField(max_length=300)
    hub_key = models.CharField(max_length=64, blank=True, default="")
    url = models.CharField(max_length=512, blank=True, default="")
    remote_state = models.CharField(max_length=16, blank=True, default="pending")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True, default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    tried_hubs = models.TextField(blank=True, default="", help_text="hub keys already tried, comma-separated")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"remote delivery {self.delivery_id} via {self.tier}"


class InboundMessage(models.Model):
    """A message another hub forwarded here: once per (origin hub, message id), whatever the retries.
    `origin_hub` is the signing origin's key, or, when the signature failed, the calling hub's key
    (`unsigned` from the relay). `reported_state` is the last state sent back as a receipt."""

    origin_hub = models.CharField(max_length=64)
    message_id = models.UUIDField()
    delivery_id = models.BigIntegerField(null=True, blank=True)
    tier = models.CharField(max_length=8, choices=FederationTier.choices)
    trust = models.CharField(max_length=24)
    reply_url = models.CharField(max_length=512, blank=True, default="")
    reported_state = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["origin_hub", "message_id"], name="inbound_once_per_origin")
        ]

    def __str__(self) -> str:
        return f"inbound {self.message_id} from {self.origin_hub[:12]}"


class RelayMessage(models.Model):
    """What a relay keeps for a hub that will pull it: routing metadata and a sealed box it
    cannot open. `kind` is `message` (pulled under the agent's lease) or `receipt`."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=8, default="message")
    message_id = models.UUIDField()
    dest_hub = models.CharField(max_length=64, db_index=True)
    agent_key = models.CharField(max_length=256, blank=True, default="")
    from_hub = models.CharField(max_length=64)
    sealed = models.BinaryField()
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    claimed_by = models.CharField(max_length=64, blank=True, default="")
    # No pull takes the row before this: a live claim's end, or a released row's wait.
    claimed_until = models.DateTimeField(null=True, blank=True)
    done = models.BooleanField(default=False)

    class Meta:
        # Keyed by the storing hub too: a key can only ever repeat or replace what it stored itself,
        # never take over (or squat) another hub's row under an id it read in a frame.
        constraints = [
            models.UniqueConstraint(
                fields=["from_hub", "kind", "message_id", "dest_hub"], name="relay_message_once_per_storer"
            )
        ]
        indexes = [models.Index(fields=["dest_hub", "agent_key", "done"], name="relay_pull")]

    def __str__(self) -> str:
        return f"relay {self.kind} {self.message_id}"


class RelayStorer(models.Model):
    """A hub key that keeps items at this relay. Each store of the key locks its row from counting
    what the key keeps (its quota) to writing the new item, so concurrent stores of one key run one
    after another and never pass the quota together. Dropped once the key keeps nothing here."""

    hub_key = models.CharField(max_length=64, unique=True)

    def __str__(self) -> str:
        return f"relay storer {self.hub_key[:12]}"


class RelayKey(models.Model):
    """The key a relay's URL said it had the first time this hub asked (`keys.relay_key`, when the
    relay's key is not configured): a different key from that URL later is refused."""

    url = models.CharField(max_length=512, unique=True)
    public_key = models.CharField(max_length=64)
    first_seen = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"relay key at {self.url}"


class RelayLease(models.Model):
    """Which hub may pull an agent's messages from this relay, until when, and that hub's signed
    statement that it took the lease (`signatures.lease_statement_sign`): what a sender checks
    before it believes the relay's word on where the name is. The lease ends with the statement."""

    agent_key = models.CharField(max_length=256, unique=True)
    agent_name = models.CharField(max_length=64)
    hub_key = models.CharField(max_length=64)
    expires_at = models.DateTimeField()
    # None only on a lease taken before statements existed: never shown to senders; its hub's next
    # renewal brings one.
    statement = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"lease {self.agent_key} -> {self.hub_key[:12]}"


class Attachment(models.Model):
    """A file stored once under its SHA-256 (never under a client-supplied name)."""

    sha256 = models.CharField(max_length=64, unique=True)
    size = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"attachment {self.sha256[:12]}"


class FileUpload(models.Model):
    """A session's upload of a stored file. Until a message uses the file, its size counts against
    the session's quota (`SWITCHBOARD_FILE_QUOTA_BYTES`); the last upload's time keeps an unused
    file from the orphan cleanup for its grace period."""

    session_id = models.UUIDField(db_index=True)
    attachment = models.ForeignKey(Attachment, on_delete=models.CASCADE, related_name="uploads")
    size = models.PositiveBigIntegerField()
    uploaded_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session_id", "attachment"], name="file_upload_once_per_session")
        ]

    def __str__(self) -> str:
        return f"upload of {self.attachment_id} by {self.session_id}"


class MessageAttachment(models.Model):
    """One file of one message, in order, with the display name it was sent under."""

    message_id = models.UUIDField(db_index=True)
    attachment = models.ForeignKey(Attachment, on_delete=models.PROTECT, related_name="uses")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=255)
    delivered_path = models.CharField(max_length=1024, blank=True, default="")
    problem = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message_id", "position"], name="attachment_once_per_position")
        ]

    def __str__(self) -> str:
        return f"file {self.position} of {self.message_id}"


class RequestNonce(models.Model):
    """A hub request's nonce, kept until the request's time could no longer be fresh: the record
    every web process of a hub shares, so the same signed request is accepted once."""

    hub_key = models.CharField(max_length=64)
    nonce = models.CharField(max_length=64)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hub_key", "nonce"], name="request_nonce_once_per_hub")
        ]

    def __str__(self) -> str:
        return f"nonce {self.nonce[:8]} from {self.hub_key[:12]}"
