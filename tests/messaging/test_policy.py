"""The pure inbound-policy function: every combination, table-driven, plus properties (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.policy import (
    ACCEPT,
    BYPASS,
    DEFAULT,
    HOLD,
    REFUSE,
    STRICTNESS,
    default_by_modes,
    inbound_decide,
    is_looser,
    trust_for,
)

MODES = (DEFAULT, BYPASS)
POLICIES = (None, ACCEPT, HOLD, REFUSE)

# Defaults by permission mode (reference 003 §2.5): (receiver mode, sender mode) → action, reason.
DEFAULTS = [
    (DEFAULT, DEFAULT, ACCEPT, "default"),
    (DEFAULT, BYPASS, HOLD, "default_bypass_sender"),
    (BYPASS, DEFAULT, HOLD, "default_bypass_receiver"),
    (BYPASS, BYPASS, ACCEPT, "default_both_bypass"),
]


@pytest.mark.parametrize(("receiver", "sender", "action", "reason"), DEFAULTS)
def test_defaults_by_permission_mode(receiver: str, sender: str, action: str, reason: str) -> None:
    verdict = inbound_decide(receiver_mode=receiver, sender_mode=sender)
    assert (verdict.action, verdict.reason, verdict.escalate) == (action, reason, "")


def expected(
    receiver: str, sender: str, own: str | None, floor: str | None, override: str | None, by_op: bool
) -> str:
    """The rules written out longhand, independently of the implementation's structure."""
    if override is not None and by_op:
        return override
    base = floor if floor is not None else default_by_modes(receiver, sender).action
    mine = override if override is not None else own
    if mine is None:
        return base
    return mine if STRICTNESS[mine] > STRICTNESS[base] else base


COMBINATIONS = list(itertools.product(MODES, MODES, POLICIES, POLICIES, POLICIES, (False, True)))


@pytest.mark.parametrize(("receiver", "sender", "own", "floor", "override", "by_op"), COMBINATIONS)
def test_every_combination(
    receiver: str, sender: str, own: str | None, floor: str | None, override: str | None, by_op: bool
) -> None:
    verdict = inbound_decide(
        receiver_mode=receiver,
        sender_mode=sender,
        receiver_policy=own,
        operator_policy=floor,
        sender_override=override,
        override_by_operator=by_op,
    )
    assert verdict.action == expected(receiver, sender, own, floor, override, by_op)
    assert verdict.escalate == ""


# A few rows spelled out, so the table above is not the only statement of the rules.
SPELLED_OUT = [
    # receiver, sender, own, operator, override, by operator → action, reason
    (BYPASS, DEFAULT, ACCEPT, None, None, False, HOLD, "default_bypass_receiver"),  # cannot loosen
    (BYPASS, DEFAULT, None, ACCEPT, None, False, ACCEPT, "operator_policy"),  # an operator can
    (DEFAULT, DEFAULT, REFUSE, ACCEPT, None, False, REFUSE, "own_policy"),  # stricter is fine
    (DEFAULT, DEFAULT, None, HOLD, ACCEPT, False, HOLD, "operator_policy"),  # own override ≥ floor
    (DEFAULT, DEFAULT, None, HOLD, ACCEPT, True, ACCEPT, "sender_override_operator"),
    (DEFAULT, DEFAULT, ACCEPT, None, REFUSE, False, REFUSE, "sender_override"),
    (DEFAULT, BYPASS, None, None, REFUSE, True, REFUSE, "sender_override_operator"),
    (DEFAULT, DEFAULT, HOLD, None, ACCEPT, False, ACCEPT, "default"),  # own override replaces own policy
]


@pytest.mark.parametrize(
    ("receiver", "sender", "own", "floor", "override", "by_op", "action", "reason"), SPELLED_OUT
)
def test_spelled_out_rows(receiver, sender, own, floor, override, by_op, action, reason) -> None:  # noqa: ANN001
    verdict = inbound_decide(
        receiver_mode=receiver,
        sender_mode=sender,
        receiver_policy=own,
        operator_policy=floor,
        sender_override=override,
        override_by_operator=by_op,
    )
    assert (verdict.action, verdict.reason) == (action, reason)


@pytest.mark.parametrize(("receiver", "sender", "own", "floor", "override", "by_op"), COMBINATIONS)
def test_sensitive_is_held_with_escalation_unless_refused(
    receiver, sender, own, floor, override, by_op
) -> None:  # noqa: ANN001
    plain = inbound_decide(
        receiver_mode=receiver,
        sender_mode=sender,
        receiver_policy=own,
        operator_policy=floor,
        sender_override=override,
        override_by_operator=by_op,
    )
    verdict = inbound_decide(
        receiver_mode=receiver,
        sender_mode=sender,
        receiver_policy=own,
        operator_policy=floor,
        sender_override=override,
        override_by_operator=by_op,
        sensitive=True,
    )
    assert verdict.escalate == "required"
    assert verdict.action == (REFUSE if plain.action == REFUSE else HOLD)
    exempt = inbound_decide(
        receiver_mode=receiver,
        sender_mode=sender,
        receiver_policy=own,
        operator_policy=floor,
        sender_override=override,
        override_by_operator=by_op,
        sensitive=True,
        sensitive_exempt=True,
    )
    assert (exempt.action, exempt.escalate) == (plain.action, "none")


policies = st.sampled_from(POLICIES)
modes = st.sampled_from(MODES)


@given(modes, modes, policies, policies, policies, st.booleans(), st.booleans(), st.booleans())
def test_properties(receiver, sender, own, floor, override, by_op, sensitive, exempt) -> None:  # noqa: ANN001
    verdict = inbound_decide(
        receiver_mode=receiver,
        sender_mode=sender,
        receiver_policy=own,
        operator_policy=floor,
        sender_override=override,
        override_by_operator=by_op,
        sensitive=sensitive,
        sensitive_exempt=exempt,
    )
    assert verdict.action in (ACCEPT, HOLD, REFUSE)
    # Nothing a session sets itself ever makes the answer looser than its floor.
    if not (override is not None and by_op):
        floor_action = floor if floor is not None else default_by_modes(receiver, sender).action
        assert STRICTNESS[verdict.action] >= STRICTNESS[floor_action]
    # A sensitive message is never accepted without an exemption.
    if sensitive and not exempt:
        assert verdict.action != ACCEPT
    # Making the session's own policy stricter never makes the answer looser.
    for stricter_own in POLICIES[1:]:
        if own is None or STRICTNESS[stricter_own] >= STRICTNESS[own]:
            tighter = inbound_decide(
                receiver_mode=receiver,
                sender_mode=sender,
                receiver_policy=stricter_own,
                operator_policy=floor,
                sender_override=override,
                override_by_operator=by_op,
                sensitive=sensitive,
                sensitive_exempt=exempt,
            )
            assert STRICTNESS[tighter.action] >= STRICTNESS[verdict.action]


def test_unknown_values_are_errors() -> None:
    with pytest.raises(ValueError):
        inbound_decide(receiver_mode=DEFAULT, sender_mode=DEFAULT, receiver_policy="allow")
    with pytest.raises(ValueError):
        inbound_decide(receiver_mode="plan", sender_mode=DEFAULT)


def test_is_looser() -> None:
    assert is_looser(ACCEPT, HOLD) and is_looser(HOLD, REFUSE)
    assert not is_looser(REFUSE, HOLD) and not is_looser(HOLD, HOLD)
    assert not is_looser(None, HOLD) and not is_looser(ACCEPT, None)


@pytest.mark.parametrize(
    ("hub_token", "signature_valid", "via", "trust"),
    [
        (True, None, "host", "host-verified"),
        (True, False, "host", "unverified"),
        (False, True, "lan", "lan-verified"),
        (False, True, "relay", "relay-verified"),
        (False, None, "lan", "network-claimed"),
        (False, None, "relay", "network-claimed"),
        (False, False, "relay", "unverified"),
        (False, None, "channel", "self-declared"),
        (False, True, "channel", "channel-verified"),
    ],
)
def test_trust_is_computed_by_the_hub(
    hub_token: bool, signature_valid: bool | None, via: str, trust: str
) -> None:
    assert trust_for(hub_token=hub_token, signature_valid=signature_valid, via=via) == trust
