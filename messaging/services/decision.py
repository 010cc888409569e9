"""The send pipeline's decision for one recipient, as a pure function over the pair's facts.

Nothing here touches the database or reads settings: the send pipeline
(`messaging.services.pipeline`) gathers the facts (the message's classification and trust, the
recipient's inbound policy verdict, the operator's rule for the pair, whether the pair is
looping, the recipient's status, how long its holds last) and calls `decide`. What needs the
database around a decision stays with the pipeline: the stopped-hold caps (`HoldFull`) are checked
on a decision to hold for a stopped recipient, the hold cap's room is made when it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from messaging.hold_reasons import LOOP_HOLD, STOPPED_HOLD
from messaging.models import MessageKind, SessionStatus, Tier
from messaging.policy import ACCEPT, HOLD, HOST_VERIFIED, REFUSE, Verdict
from messaging.sensitivity import Classification
from messaging.states import DeliveryState

S = DeliveryState


@dataclass
class Decision:
    """The send pipeline's verdict for one recipient, before anything is written."""

    state: str
    hold_reason: str = ""
    expires_at: datetime | None = None
    escalate: str = ""
    tier: str = Tier.INFO
    trust: str = HOST_VERIFIED
    reason: str = ""
    # What the sensitive tier found (`messaging.sensitivity.Classification`), when it found anything.
    sensitivity: Classification | None = None


@dataclass(frozen=True)
class DecisionFacts:
    """Everything the decision for one message to one recipient depends on."""

    classification: Classification  # the message's tier and what the sensitive tier found
    trust: str
    verdict: Verdict  # the recipient's inbound policy for this sender and tier (`inbound_verdict`)
    override: str | None  # the recipient's rule for this sender (accept / hold / refuse), if any
    override_by_operator: bool
    looping: bool  # both directions of the pair at the loop threshold (`pipeline._Batch._looping`)
    kind: str
    recipient_status: str
    now: datetime
    hold_seconds: int  # how long a hold for an operator waits (`holds.hold_expiry_seconds_of`)
    stopped_hold_seconds: int  # how long a message waits for a stopped recipient


def decide(facts: DecisionFacts) -> Decision:
    """Refused by policy or a user-stopped recipient; held by policy, for a reply loop (plain
    text, unless an operator allowed the pair) or for a stopped recipient; else queued."""
    classification, verdict = facts.classification, facts.verdict
    marks = {
        "tier": classification.tier,
        "trust": facts.trust,
        "escalate": verdict.escalate,
        "sensitivity": classification if classification.matches else None,
    }
    if verdict.action == REFUSE:
        return Decision(state=S.REFUSED, reason=f"inbound policy: {verdict.reason}", **marks)
    if facts.recipient_status == SessionStatus.USER_STOPPED:
        return Decision(state=S.REFUSED, reason="the recipient was stopped by its user", **marks)
    held_until = facts.now + timedelta(seconds=facts.hold_seconds)
    if verdict.action == HOLD:
        return Decision(state=S.HELD, hold_reason=verdict.reason, expires_at=held_until, **marks)
    # An operator's explicit allow for this pair says the human has seen them talk: no loop hold.
    operator_allowed = facts.override == ACCEPT and facts.override_by_operator
    if facts.kind == MessageKind.TEXT and facts.looping and not operator_allowed:
        return Decision(state=S.HELD, hold_reason=LOOP_HOLD, expires_at=held_until, **marks)
    if facts.recipient_status == SessionStatus.STOPPED:
        until = facts.now + timedelta(seconds=facts.stopped_hold_seconds)
        return Decision(state=S.HELD, hold_reason=STOPPED_HOLD, expires_at=until, **marks)
    return Decision(state=S.QUEUED, **marks)
