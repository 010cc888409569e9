"""The send decision as a pure function (`messaging.services.decision.decide`): no database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from messaging.models import MessageKind, SessionStatus, Tier
from messaging.policy import ACCEPT, HOLD, REFUSE, Verdict
from messaging.sensitivity import Classification
from messaging.services.decision import DecisionFacts, decide
from messaging.states import DeliveryState as S

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PLAIN = DecisionFacts(
    classification=Classification(tier=Tier.INFO),
    trust="host-verified",
    verdict=Verdict(ACCEPT, "default"),
    override=None,
    override_by_operator=False,
    looping=False,
    kind=MessageKind.TEXT,
    recipient_status=SessionStatus.IDLE,
    now=NOW,
    hold_seconds=600,
    stopped_hold_seconds=86400,
)


def test_a_plain_message_to_a_live_recipient_is_queued_with_its_marks() -> None:
    decision = decide(PLAIN)
    assert (decision.state, decision.hold_reason, decision.expires_at) == (S.QUEUED, "", None)
    assert (decision.tier, decision.trust, decision.sensitivity) == (Tier.INFO, "host-verified", None)


def test_refused_by_policy_names_the_policy() -> None:
    decision = decide(replace(PLAIN, verdict=Verdict(REFUSE, "receiver_refuses")))
    assert (decision.state, decision.reason) == (S.REFUSED, "inbound policy: receiver_refuses")


def test_held_by_policy_waits_for_an_operator_for_the_recipients_hold_time() -> None:
    sensitive = Classification(tier=Tier.SENSITIVE, matches=("aws_secret",))
    decision = decide(
        replace(PLAIN, classification=sensitive, verdict=Verdict(HOLD, "sensitive", escalate="required"))
    )
    assert (decision.state, decision.hold_reason) == (S.HELD, "sensitive")
    assert decision.expires_at == NOW + timedelta(seconds=600)
    assert (decision.tier, decision.escalate, decision.sensitivity) == (Tier.SENSITIVE, "required", sensitive)


def test_a_looping_pair_is_held_but_only_for_plain_text() -> None:
    decision = decide(replace(PLAIN, looping=True))
    assert (decision.state, decision.hold_reason) == (S.HELD, "loop_suspected")
    assert decision.expires_at == NOW + timedelta(seconds=600)
    assert decide(replace(PLAIN, looping=True, kind=MessageKind.FRAME)).state == S.QUEUED


def test_an_operators_allow_for_the_pair_skips_the_loop_hold_a_senders_does_not() -> None:
    by_operator = replace(PLAIN, looping=True, override=ACCEPT, override_by_operator=True)
    assert decide(by_operator).state == S.QUEUED
    by_recipient = replace(PLAIN, looping=True, override=ACCEPT, override_by_operator=False)
    assert decide(by_recipient).hold_reason == "loop_suspected"


def test_a_stopped_recipient_has_its_messages_held_until_it_starts_again() -> None:
    decision = decide(replace(PLAIN, recipient_status=SessionStatus.STOPPED))
    assert (decision.state, decision.hold_reason) == (S.HELD, "recipient_stopped")
    assert decision.expires_at == NOW + timedelta(seconds=86400)
    # Policy and loops come first: what an operator must see is held for the operator.
    held = decide(replace(PLAIN, recipient_status=SessionStatus.STOPPED, looping=True))
    assert held.hold_reason == "loop_suspected"


def test_a_user_stopped_recipient_refuses_before_any_hold_but_policy_refusal_names_the_policy() -> None:
    user_stopped = replace(PLAIN, recipient_status=SessionStatus.USER_STOPPED)
    assert (decide(user_stopped).state, decide(user_stopped).reason) == (
        S.REFUSED,
        "the recipient was stopped by its user",
    )
    assert decide(replace(user_stopped, verdict=Verdict(HOLD, "receiver_holds"))).state == S.REFUSED
    refused = decide(replace(user_stopped, verdict=Verdict(REFUSE, "receiver_refuses")))
    assert refused.reason == "inbound policy: receiver_refuses"
