"""Teams: a lead, its teammates, their shared task board, and the team protocol's open requests.

A session leads at most one live team and sits in at most one live roster. A member has its own
id (not its session's), so a name reused by a later teammate never reaches the old member's work.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from messaging.models import AgentSession, Message


class Team(models.Model):
    """One lead session and its roster. Ending a team keeps its tasks and history."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=64)
    lead_session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="led_teams")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    ended_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["lead_session"], condition=Q(ended_at__isnull=True), name="team_one_live_per_lead"
            )
        ]

    def __str__(self) -> str:
        return f"team {self.name}"

    @property
    def live(self) -> bool:
        return self.ended_at is None


class Role(models.TextChoices):
    LEAD = "lead"
    TEAMMATE = "teammate"


class Membership(models.Model):
    """A place on a team's roster. `id` is the member id; it is never reused."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=12, choices=Role.choices)
    name = models.CharField(max_length=64, help_text="the member's name on this roster")
    name_key = models.CharField(max_length=256)
    joined_at = models.DateTimeField(auto_now_add=True)
    left_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["joined_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"], condition=Q(left_at__isnull=True), name="membership_one_live_per_session"
            ),
            models.UniqueConstraint(
                fields=["team", "name_key"],
                condition=Q(left_at__isnull=True),
                name="membership_live_name_unique_in_team",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.name} of {self.team_id}"

    @property
    def active(self) -> bool:
        return self.left_at is None


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    # Only a quality gate refusing `task_created` puts a task here; it never leaves it.
    REJECTED = "rejected"


class GateEvent(models.TextChoices):
    TASK_CREATED = "task_created"
    TASK_COMPLETED = "task_completed"
    TEAMMATE_IDLE = "teammate_idle"


class Task(models.Model):
    """A unit of work on a team's board. Every change bumps `revision` (compare-and-set)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tasks")
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    status = models.CharField(
        max_length=12, choices=TaskStatus.choices, default=TaskStatus.PENDING, db_index=True
    )
    owner = models.ForeignKey(
        Membership, null=True, blank=True, on_delete=models.SET_NULL, related_name="owned_tasks"
    )
    blocked_by = models.ManyToManyField(
        "self", symmetrical=False, through="TaskEdge", related_name="blocks", blank=True
    )
    revision = models.PositiveIntegerField(default=1)
    # A quality-gate check this task waits on ("" when none): task_created or task_completed.
    gate_pending = models.CharField(max_length=20, blank=True, default="")
    gate_reason = models.CharField(max_length=500, blank=True, default="")
    created_by = models.ForeignKey(
        Membership, null=True, blank=True, on_delete=models.SET_NULL, related_name="created_tasks"
    )
    result = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["team", "status", "id"], name="task_board")]

    def __str__(self) -> str:
        return f"task {self.pk} ({self.status})"


class TaskEdge(models.Model):
    """`task` waits until `blocker` is completed."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="edges_in")
    blocker = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="edges_out")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "blocker"], name="task_edge_once"),
            models.CheckConstraint(condition=~Q(task=models.F("blocker")), name="task_edge_not_self"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} blocked by {self.blocker_id}"


class RequestKind(models.TextChoices):
    SHUTDOWN = "shutdown"
    PLAN_APPROVAL = "plan_approval"
    PERMISSION = "permission"


class RequestState(models.TextChoices):
    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class FrameRequest(models.Model):
    """A protocol request frame waiting for its one answer (shutdown, plan approval, permission).

    A response frame is accepted only when it names an open request and comes from `responder`."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="requests")
    kind = models.CharField(max_length=16, choices=RequestKind.choices)
    requester = models.ForeignKey(Membership, on_delete=models.CASCADE, related_name="+")
    responder = models.ForeignKey(Membership, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(
        max_length=12, choices=RequestState.choices, default=RequestState.OPEN, db_index=True
    )
    payload = models.JSONField(default=dict, blank=True)
    reason = models.CharField(max_length=1000, blank=True, default="")
    # The frames that carried this request's text: the request to `responder` (`payload`, and
    # `reason` while open) and the answer to `requester` (`reason` once answered). Who may read
    # that text on the request is decided by these frames' deliveries (teams.services.frames).
    request_message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    response_message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            # One open shutdown request per teammate: asking twice returns the first, never loops.
            models.UniqueConstraint(
                fields=["responder"],
                condition=Q(state="open", kind="shutdown"),
                name="frame_request_one_open_shutdown",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} request {self.id} ({self.state})"


class SubscriptionState(models.TextChoices):
    WAITING = "waiting"
    FIRED = "fired"
    LAPSED = "lapsed"


class Subscription(models.Model):
    """`notify_when_idle`: tell `subscriber` once, at `target`'s next idle or exit."""

    subscriber = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="subscriptions")
    target = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="watchers")
    state = models.CharField(
        max_length=8, choices=SubscriptionState.choices, default=SubscriptionState.WAITING, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    fired_on = models.CharField(max_length=12, blank=True, default="", help_text="idle | exited")
    notification = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["subscriber", "target"],
                condition=Q(state="waiting"),
                name="subscription_one_waiting_per_pair",
            )
        ]

    def __str__(self) -> str:
        return f"{self.subscriber_id} waits for {self.target_id} ({self.state})"


class QualityGate(models.Model):
    """An HTTP hook a team calls on one event. A 409 with a reason blocks the transition."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="gates")
    event = models.CharField(max_length=20, choices=GateEvent.choices)
    url = models.URLField(max_length=500)
    timeout_seconds = models.FloatField(default=5.0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    fail_closed = models.BooleanField(
        default=False, help_text="When the hook cannot be reached after every attempt: block (True) or allow."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "event"], name="gate_once_per_event")]

    def __str__(self) -> str:
        return f"{self.event} gate of {self.team_id}"


class CheckState(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    FAILED = "failed"


class GateCheck(models.Model):
    """One call of a quality gate for one transition, retried until it is decided."""

    gate = models.ForeignKey(QualityGate, null=True, on_delete=models.SET_NULL, related_name="checks")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="gate_checks")
    event = models.CharField(max_length=20, choices=GateEvent.choices)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.CASCADE, related_name="checks")
    member = models.ForeignKey(Membership, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=10, choices=CheckState.choices, default=CheckState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=1000, blank=True, default="")
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="gate_check_due")]

    def __str__(self) -> str:
        return f"{self.event} check {self.pk} ({self.state})"


class Observer(models.Model):
    """A session that may only send one-way observer reports to one target, and receives nothing."""

    session = models.OneToOneField(AgentSession, on_delete=models.CASCADE, related_name="observer")
    target_session = models.ForeignKey(
        AgentSession, null=True, blank=True, on_delete=models.CASCADE, related_name="observers"
    )
    target_team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="observers"
    )
    registered_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(target_session__isnull=False) & Q(target_team__isnull=True))
                | (Q(target_session__isnull=True) & Q(target_team__isnull=False)),
                name="observer_exactly_one_target",
            )
        ]

    def __str__(self) -> str:
        return f"observer {self.session_id}"


class InvitationState(models.TextChoices):
    OPEN = "open"
    ACCEPTED = "accepted"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class InvitationAsker(models.TextChoices):
    LEAD = "lead"  # the lead invited the session; the session answers
    SESSION = "session"  # the session asked to join; the lead answers


def one_open_per(*fields: str, name: str) -> models.UniqueConstraint:
    """At most one open row (an `Answerable` waiting for its answer) per value of `fields`."""
    return models.UniqueConstraint(fields=list(fields), condition=Q(state="open"), name=name)


class Answerable(models.Model):
    """A yes that waits for an answer until it expires (the state and times an invitation and a
    request to join share)."""

    state = models.CharField(
        max_length=10, choices=InvitationState.choices, default=InvitationState.OPEN, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self._meta.verbose_name} {self.pk} ({self.state})"


class Invitation(Answerable):
    """One side's yes to a session joining a team, waiting for the other side's.

    A session joins a team only with both yeses (the lead's and its own) or an operator's. Whoever
    opened it (`asked_by`) waits; the other side accepts or declines. One open per team and session.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="team_invitations")
    name = models.CharField(max_length=64, help_text="the name it will have on the roster")
    asked_by = models.CharField(max_length=8, choices=InvitationAsker.choices)
    answered_by = models.CharField(max_length=200, blank=True, default="")

    class Meta(Answerable.Meta):
        constraints = [one_open_per("team", "session", name="invitation_one_open_per_pair")]


class JoinRequest(Answerable):
    """A session's request to join the team another session leads, as the asker keeps it.

    Every ask writes one, whether or not the session asked leads a live team, so what the asker
    lists and withdraws tells it nothing of who leads what (`team_ask_to_join`). When the session
    asked leads one, `invitation` is the request its lead answers, and the lead's answer (accept,
    decline) closes this one too. One open per asker and session asked.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    asker = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="join_requests")
    lead = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=64, help_text="the name it asked to have on the roster")
    invitation = models.ForeignKey(
        Invitation, null=True, blank=True, on_delete=models.SET_NULL, related_name="join_requests"
    )

    class Meta(Answerable.Meta):
        constraints = [one_open_per("asker", "lead", name="join_request_one_open_per_pair")]


class Watcher(models.Model):
    """`target` lets `watcher` read its final answers (in the notices of fired subscriptions).

    Granted by the target itself or an operator; its lead and teammates need no grant."""

    target = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="watcher_grants")
    watcher = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="watching_grants")
    granted_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["target", "watcher"], name="watcher_once_per_pair")]

    def __str__(self) -> str:
        return f"{self.watcher_id} may watch {self.target_id}"


class NoticeSlot(models.Model):
    """The latest notice of one kind the hub wrote from one source to one recipient.

    A newer notice of the same kind and source expires this one while it is still unread in the
    recipient's inbox (queued or held), so at most one of each waits there."""

    recipient = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32)
    source = models.CharField(max_length=64)
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["recipient", "kind", "source"], name="notice_slot_once")
        ]

    def __str__(self) -> str:
        return f"{self.kind} from {self.source} to {self.recipient_id}"
