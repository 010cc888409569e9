"""The delivery state machine: the table itself, and conditional moves on it."""

import pytest

from messaging.models import AgentSession, Delivery, Message
from messaging.principals import HUB
from messaging.services.delivery import delivery_transition
from messaging.states import FINAL_STATES, TRANSITIONS, DeliveryState, can_transition

S = DeliveryState

EXPECTED_EDGES = {
    ("accepted", "queued"),
    ("accepted", "held"),
    ("accepted", "refused"),
    ("accepted", "relayed"),
    ("queued", "delivered"),
    ("queued", "read"),
    ("queued", "failed"),
    ("queued", "expired"),
    ("held", "queued"),
    ("held", "denied"),
    ("held", "expired"),
    ("delivered", "read"),
    ("relayed", "delivered"),
    ("relayed", "read"),
    ("relayed", "failed"),
}


def test_transition_table_is_exactly_the_documented_graph():
    edges = {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts}
    assert edges == EXPECTED_EDGES
    assert set(TRANSITIONS) == set(S.values)


def test_final_states_have_no_way_out():
    assert {"read", "refused", "denied", "expired", "failed"} == FINAL_STATES
    for final in FINAL_STATES:
        assert not any(can_transition(final, other) for other in S.values)


def test_nothing_goes_back_to_held_or_accepted():
    for state in S.values:
        assert not can_transition(state, S.ACCEPTED)
    assert [s for s in S.values if can_transition(s, S.HELD)] == [S.ACCEPTED]


@pytest.fixture
def delivery(db):
    from django.utils import timezone

    now = timezone.now()
    a = AgentSession.objects.create(
        name="a", name_key="a", ref="aaaaaa", token_hash="1", last_seen=now, status_changed_at=now
    )
    b = AgentSession.objects.create(
        name="b", name_key="b", ref="bbbbbb", token_hash="2", last_seen=now, status_changed_at=now
    )
    m = Message.objects.create(sender=a, text="x", size=1, sha256="0" * 64)
    return Delivery.objects.create(message=m, recipient=b, state=S.QUEUED)


@pytest.mark.parametrize(
    ("start", "target", "moves"),
    [
        ("queued", "delivered", True),
        ("delivered", "delivered", False),
        ("read", "delivered", False),
        ("held", "delivered", False),
        ("held", "queued", True),
        ("expired", "queued", False),
        ("denied", "queued", False),
    ],
)
def test_a_move_happens_only_along_an_edge_and_only_once(delivery, start, target, moves):
    Delivery.objects.filter(pk=delivery.pk).update(state=start)
    first = delivery_transition(Delivery.objects.filter(pk=delivery.pk), to=target, actor=HUB)
    assert bool(first) is moves
    second = delivery_transition(Delivery.objects.filter(pk=delivery.pk), to=target, actor=HUB)
    assert second == []  # a retry never moves it again
    delivery.refresh_from_db()
    assert delivery.state == (target if moves else start)


def test_the_states_before_one_are_read_off_the_table():
    """The order receipts keep (`states_before`): every state a delivery can come from, by one
    move or more; none for `accepted`, and a state is never before itself."""
    from messaging.states import states_before

    assert set(states_before(S.DELIVERED)) == {S.ACCEPTED, S.QUEUED, S.HELD, S.RELAYED}
    assert set(states_before(S.READ)) == {S.ACCEPTED, S.QUEUED, S.HELD, S.DELIVERED, S.RELAYED}
    assert set(states_before(S.QUEUED)) == {S.ACCEPTED, S.HELD}
    assert states_before(S.ACCEPTED) == []
    assert all(state not in states_before(state) for state in S.values)
