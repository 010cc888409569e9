"""Why a delivery is held: the one table of hold-reason codes, each in two wordings.

The codes come from `messaging.policy` (inbound policy, sensitive tier), the send pipeline
(suspected loop, stopped recipient) and federation (unknown or revoked peer hub, an isolated
machine). The sender is told in the second person why its message waits; the operator reads a
short phrase at a glance.
An unknown code is shown as it is, so a new code is never hidden, only unworded. The codes of
the inbound policy's rules are written in `messaging.policy`, beside each rule; the others are
named here, and every place that holds a delivery or looks for a kind of hold uses the name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SENSITIVE_HOLD = "sensitive"
LOOP_HOLD = "loop_suspected"
# Holds that wait for the recipient to start, not for a human; the operator can still decide them.
STOPPED_HOLD = "recipient_stopped"
# A forwarded message held for an operator because of the hub that sent it, or because it leaves
# an isolated machine.
UNKNOWN_PEER_HOLD = "unknown_peer"
REVOKED_PEER_HOLD = "peer_revoked"
ISOLATION_HOLD = "isolation"
# Holds for the hub key a message came from, which anyone can make at home: they are counted apart
# from a recipient's other holds for an operator (`messaging.services.holds`).
PEER_HOLDS = (UNKNOWN_PEER_HOLD, REVOKED_PEER_HOLD)


@dataclass(frozen=True)
class HoldReason:
    """One hold-reason code: what the operator reads, and what the sender is told."""

    operator: str
    sender: str


HOLD_REASONS: dict[str, HoldReason] = {
    "operator_policy": HoldReason(
        operator="operator's floor for the recipient: hold",
        sender="an operator set the recipient to hold incoming messages",
    ),
    "sender_override_operator": HoldReason(
        operator="operator's rule for this sender: hold",
        sender="an operator set the recipient to hold messages from you",
    ),
    "sender_override": HoldReason(
        operator="the recipient holds messages from this sender",
        sender="the recipient holds messages from you",
    ),
    "own_policy": HoldReason(
        operator="the recipient's own policy: hold",
        sender="the recipient holds incoming messages",
    ),
    "default_bypass_receiver": HoldReason(
        operator="the recipient runs in bypass mode and the sender does not",
        sender="the recipient runs without permission prompts, so it holds messages from senders that do not",
    ),
    "default_bypass_sender": HoldReason(
        operator="the sender runs in bypass mode",
        sender="you run without permission prompts, so the recipient holds your messages",
    ),
    SENSITIVE_HOLD: HoldReason(
        operator="sensitive",
        sender="the text looks sensitive (a credential, a destructive command or a transcript request), "
        "so a human must look at it first (escalate=required)",
    ),
    LOOP_HOLD: HoldReason(
        operator="suspected reply loop",
        sender="you and the recipient have recently exchanged many messages in both directions, "
        "which looks like a reply loop",
    ),
    STOPPED_HOLD: HoldReason(
        operator="the recipient is stopped",
        sender="the recipient is stopped; it gets the message when it starts again",
    ),
    UNKNOWN_PEER_HOLD: HoldReason(
        operator="from a hub key nobody pinned: pin the key (Peers) to trust its future messages",
        sender="it comes from a hub whose key no operator of this hub has pinned (first contact), so an "
        "operator must approve it (escalate=required); once they pin your hub's key, its messages go "
        "straight through",
    ),
    REVOKED_PEER_HOLD: HoldReason(
        operator="from a revoked hub (mode: hold)",
        sender="an operator of this hub revoked the hub it comes from and holds its messages "
        "(escalate=required)",
    ),
    ISOLATION_HOLD: HoldReason(
        operator="leaving this machine, which an operator isolated",
        sender="an operator isolated this machine, so messages leaving it wait for an operator",
    ),
}


def hold_reason_text(code: str) -> str:
    """Why a message waits, in words for its sender."""
    reason = HOLD_REASONS.get(code)
    return reason.sender if reason else (code or "inbound policy")


def hold_reason_label(code: str, matched: Iterable[str] = ()) -> str:
    """Why a delivery is held, in words for an operator; for a sensitive hold, what matched
    ("sensitive content: AWS secret access key, destructive command: git push --force")."""
    reason = HOLD_REASONS.get(code)
    words = reason.operator if reason else (code or "inbound policy")
    found = [m for m in matched if m]
    return f"{words}: {', '.join(found)}" if found else words
