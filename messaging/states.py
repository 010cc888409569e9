"""Delivery states and the transitions between them, as data.

A delivery moves only along an edge listed here, and only by a conditional update on its
current state (see `messaging.services.delivery.delivery_transition`), so a retried task or a
duplicate request can never move one twice.
"""

from __future__ import annotations

from django.db import models


class DeliveryState(models.TextChoices):
    ACCEPTED = "accepted"
    QUEUED = "queued"
    HELD = "held"
    DELIVERED = "delivered"
    READ = "read"
    REFUSED = "refused"
    DENIED = "denied"
    EXPIRED = "expired"
    FAILED = "failed"
    RELAYED = "relayed"


S = DeliveryState

TRANSITIONS: dict[str, frozenset[str]] = {
    S.ACCEPTED: frozenset({S.QUEUED, S.HELD, S.REFUSED, S.RELAYED}),
    S.QUEUED: frozenset({S.DELIVERED, S.READ, S.FAILED, S.EXPIRED}),
    S.HELD: frozenset({S.QUEUED, S.DENIED, S.EXPIRED}),
    S.DELIVERED: frozenset({S.READ}),
    S.RELAYED: frozenset({S.DELIVERED, S.READ, S.FAILED}),
    S.READ: frozenset(),
    S.REFUSED: frozenset(),
    S.DENIED: frozenset(),
    S.EXPIRED: frozenset(),
    S.FAILED: frozenset(),
}

FINAL_STATES = frozenset(state for state, nexts in TRANSITIONS.items() if not nexts)


def _reachable(state: str) -> frozenset[str]:
    found: set[str] = set()
    todo = list(TRANSITIONS[state])
    while todo:
        state = todo.pop()
        if state not in found:
            found.add(state)
            todo += TRANSITIONS[state]
    return frozenset(found)


# Every state a delivery can reach from each state by one move or more: the order of the states,
# read off the one table above (it has no cycle, so no state comes after itself).
LATER_STATES: dict[str, frozenset[str]] = {state: _reachable(state) for state in TRANSITIONS}

# The timestamp column that records when a delivery entered each state.
STATE_TIMESTAMP = {
    S.QUEUED: "queued_at",
    S.HELD: "held_at",
    S.DELIVERED: "delivered_at",
    S.READ: "read_at",
    S.REFUSED: "final_at",
    S.DENIED: "final_at",
    S.EXPIRED: "final_at",
    S.FAILED: "final_at",
    S.RELAYED: "relayed_at",
}


def can_transition(current: str, new: str) -> bool:
    """True when `new` is a legal next state of `current`."""
    return new in TRANSITIONS.get(current, frozenset())


def sources_of(new: str) -> list[str]:
    """Every state from which a delivery may move to `new`."""
    return [state for state, nexts in TRANSITIONS.items() if new in nexts]


def states_before(state: str) -> list[str]:
    """Every state from which a delivery can come to `state` by one move or more: those a report
    of `state` moves forward (any other state is `state` itself, after it, or on another branch)."""
    return [earlier for earlier, later in LATER_STATES.items() if state in later]
