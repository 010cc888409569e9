"""Inbound policy as a pure function: who may put a message in a session's inbox, and how.

Nothing here touches the database. The send service gathers the facts (both permission modes,
the recipient's own policy, the operator's policy for it, a per-sender override, the message tier)
and `inbound_decide` answers accept, hold or refuse with a reason code.

The rules, in order:
1. The *floor* is what an operator set for the recipient (`operator_policy`); when no operator set
   one, it is the default by permission modes: a bypass receiver holds unless the sender is bypass
   too; a default (prompting) receiver accepts, but holds a sender in bypass mode.
2. The recipient's own policy (or its own per-sender override) may only make that stricter
   (accept < hold < refuse), never looser.
3. A per-sender override set by an operator replaces both: the operator is the human in charge.
4. A sensitive message is held for a human with escalate=required whatever 1-3 said, unless the
   answer was already refuse (stricter than a hold) or the sender is exempt (an operator-configured,
   verified sender), in which case the tag is informational (escalate=none).
"""

from __future__ import annotations

from dataclasses import dataclass

from messaging.hold_reasons import SENSITIVE_HOLD

ACCEPT = "accept"
HOLD = "hold"
REFUSE = "refuse"
ACTIONS = (ACCEPT, HOLD, REFUSE)
STRICTNESS = {ACCEPT: 0, HOLD: 1, REFUSE: 2}

BYPASS = "bypass"
DEFAULT = "default"
PERMISSION_MODES = (DEFAULT, BYPASS)

# Trust values the hub computes for a message's sender (never taken from the sender).
HOST_VERIFIED = "host-verified"
CHANNEL_VERIFIED = "channel-verified"
LAN_VERIFIED = "lan-verified"
RELAY_VERIFIED = "relay-verified"
SELF_DECLARED = "self-declared"
NETWORK_CLAIMED = "network-claimed"
UNVERIFIED = "unverified"
VERIFIED_TRUSTS = frozenset({HOST_VERIFIED, CHANNEL_VERIFIED, LAN_VERIFIED, RELAY_VERIFIED})


@dataclass(frozen=True)
class Verdict:
    """What to do with one inbound message, and the reason code that explains it."""

    action: str
    reason: str
    escalate: str = ""  # "required" | "none" | "" (not sensitive)


def stricter(a: str, b: str) -> str:
    """The stricter of two actions (accept < hold < refuse)."""
    return a if STRICTNESS[a] >= STRICTNESS[b] else b


def default_by_modes(receiver_mode: str, sender_mode: str) -> Verdict:
    """The policy when no operator set one: reference behaviour for the two permission modes."""
    if receiver_mode == BYPASS:
        if sender_mode == BYPASS:
            return Verdict(ACCEPT, "default_both_bypass")
        return Verdict(HOLD, "default_bypass_receiver")
    if sender_mode == BYPASS:
        return Verdict(HOLD, "default_bypass_sender")
    return Verdict(ACCEPT, "default")


def is_looser(requested: str | None, floor: str | None) -> bool:
    """True when a session asks for a policy looser than the operator's floor."""
    return requested is not None and floor is not None and STRICTNESS[requested] < STRICTNESS[floor]


def inbound_decide(
    *,
    receiver_mode: str,
    sender_mode: str,
    receiver_policy: str | None = None,
    operator_policy: str | None = None,
    sender_override: str | None = None,
    override_by_operator: bool = False,
    sensitive: bool = False,
    sensitive_exempt: bool = False,
) -> Verdict:
    """Decide accept / hold / refuse for one message from plain facts (see the module docstring)."""
    for value in (receiver_policy, operator_policy, sender_override):
        if value is not None and value not in STRICTNESS:
            raise ValueError(f"unknown policy {value!r}")
    if receiver_mode not in PERMISSION_MODES or sender_mode not in PERMISSION_MODES:
        raise ValueError("permission modes are `default` or `bypass`")

    if sender_override is not None and override_by_operator:
        verdict = Verdict(sender_override, "sender_override_operator")
    else:
        floor = (
            Verdict(operator_policy, "operator_policy")
            if operator_policy is not None
            else default_by_modes(receiver_mode, sender_mode)
        )
        own, own_reason = (
            (sender_override, "sender_override")
            if sender_override is not None
            else (receiver_policy, "own_policy")
        )
        verdict = floor
        if own is not None and STRICTNESS[own] > STRICTNESS[floor.action]:
            verdict = Verdict(own, own_reason)

    if not sensitive:
        return verdict
    if sensitive_exempt:
        return Verdict(verdict.action, verdict.reason, escalate="none")
    if verdict.action == REFUSE:
        return Verdict(REFUSE, verdict.reason, escalate="required")
    return Verdict(HOLD, SENSITIVE_HOLD, escalate="required")


def trust_for(*, hub_token: bool, signature_valid: bool | None = None, via: str = "host") -> str:
    """The trust the hub gives a sender: a hub token is host-verified; a signature that fails is
    unverified; a checked signature is `<tier>-verified`; a network sender with nothing to check is
    network-claimed; anything else is self-declared."""
    if signature_valid is False:
        return UNVERIFIED
    if hub_token and via == "host":
        return HOST_VERIFIED
    if signature_valid:
        return f"{via}-verified"
    if via in ("lan", "relay"):
        return NETWORK_CLAIMED
    return SELF_DECLARED
