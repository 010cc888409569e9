"""The unread counts the database keeps (models.UnreadCount and UnreadShare, migrations 0004's and
0011's triggers).

Every send reads a recipient's unread count for the unread cap, and the sender's share of it; the
triggers keep both, so they must equal a real count of queued + delivered deliveries (all of them,
and per sender) after anything that moves, adds or removes one. Run on SQLite by the fast suite
and on PostgreSQL (statement triggers) by the PG stage."""

from __future__ import annotations

import importlib
import random
import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import Count, Sum

from messaging.errors import SwitchboardError
from messaging.models import (
    AgentSession,
    Delivery,
    MessageKind,
    SenderPolicy,
    SessionStatus,
    UnreadCount,
    UnreadShare,
)
from messaging.principals import operator_principal, session_principal
from messaging.services.delivery import TOLD_OF_MOVES_SQL, inbox_ack, inbox_pull
from messaging.services.holds import holds_decide
from messaging.services.limits import UNREAD_STATES
from messaging.services.pipeline import message_send, messages_send_batch
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register, session_set_status
from messaging.states import DeliveryState

S = DeliveryState
OPERATOR = operator_principal("test-operator")


@pytest.fixture(autouse=True)
def _no_anti_flood(settings) -> None:
    settings.SWITCHBOARD_RATE_PAIR = 1_000_000
    settings.SWITCHBOARD_RATE_HUB = 1_000_000
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 1_000_000
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 1_000_000


def unread_count(recipient_id: object) -> int:
    """The recipient's unread count as the database keeps it (what the unread cap reads)."""
    return int(UnreadCount.objects.filter(recipient_id=recipient_id).aggregate(n=Sum("n"))["n"] or 0)


def unread_waiting(recipient_id: object) -> Any:
    """The recipient's accepted-but-unread deliveries, row by row: what the kept count must equal."""
    return Delivery.objects.filter(recipient_id=recipient_id, state__in=UNREAD_STATES)


def assert_counts_match() -> None:
    """Every session's kept unread count, and every sender's share of it, equal a real count."""
    for session in AgentSession.objects.all():
        kept, counted = unread_count(session.id), unread_waiting(session.id).count()
        assert kept == counted, f"{session.name}: kept {kept}, counted {counted}"
    assert shares_kept() == shares_counted()


def shares_kept() -> dict[tuple[object, object], int]:
    """(recipient id, sender id) → the count the database keeps, for sessions that still exist."""
    sessions = set(AgentSession.objects.values_list("id", flat=True))
    rows = UnreadShare.objects.values_list("recipient_id", "sender_id").annotate(total=Sum("n"))
    return {(r, s): n for r, s, n in rows if n and r in sessions and s in sessions}


def shares_counted() -> dict[tuple[object, object], int]:
    """(recipient id, sender id) → queued + delivered deliveries of the sender's messages (those
    it is told of: not a notice the hub wrote about it, `told_of_moves`)."""
    waiting = Delivery.objects.filter(state__in=UNREAD_STATES, message__sender__isnull=False).exclude(
        message__kind=MessageKind.NOTIFICATION
    )
    rows = waiting.values_list("recipient_id", "message__sender_id").annotate(total=Count("id"))
    return {(r, s): n for r, s, n in rows}


def test_the_migration_counts_the_states_the_cap_means() -> None:
    for name in ("0004_unread_counts", "0011_unread_shares"):
        migration = importlib.import_module(f"messaging.migrations.{name}")
        written_out = migration.UNREAD
        assert written_out == "(" + ", ".join(f"'{state.value}'" for state in UNREAD_STATES) + ")"


def test_the_share_counts_whom_a_delivery_is_told_to_as_the_code_does() -> None:
    migration = importlib.import_module("messaging.migrations.0012_unread_shares_told")
    assert migration.TOLD == TOLD_OF_MOVES_SQL


@pytest.mark.django_db
def test_every_way_a_delivery_moves_keeps_the_count() -> None:
    alice, bob, carol = (session_register(name=n).session for n in ("alice", "bob", "carol"))
    for i in range(3):
        message_send(SendRequest(sender=alice, to="bob", text=f"queued {i}"))
    assert unread_count(bob.id) == 3
    messages_send_batch(
        sender=alice, items=[{"to": "bob", "text": "batch 1"}, {"to": "carol", "text": "batch 2"}]
    )
    assert (unread_count(bob.id), unread_count(carol.id)) == (4, 1)
    assert_counts_match()

    # Held messages are not unread until an operator approves them.
    SenderPolicy.objects.create(recipient=bob, sender=carol, action="hold", by_operator=True)
    held = [message_send(SendRequest(sender=carol, to="bob", text=f"held {i}")) for i in range(3)]
    assert {h.status for h in held} == {S.HELD} and unread_count(bob.id) == 4
    holds_decide(delivery_ids=[held[0].delivery.pk], approve=True, actor=OPERATOR)
    holds_decide(delivery_ids=[held[1].delivery.pk], approve=False, actor=OPERATOR)
    assert unread_count(bob.id) == 5
    assert_counts_match()

    # Pulled (delivered) messages are still unread; acked ones are not.
    pulled = inbox_pull(recipient=bob, actor=session_principal(bob), limit=2)
    assert unread_count(bob.id) == 5
    inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=[str(d.message_id) for d in pulled])
    assert unread_count(bob.id) == 3
    assert_counts_match()

    # A stopped recipient's messages wait as holds; they count again once it is back. (Carol has
    # the batch's message and the hub's notices of the two decisions on her holds.)
    assert unread_count(carol.id) == 3
    session_set_status(session=carol, status=SessionStatus.STOPPED, actor=session_principal(carol))
    message_send(SendRequest(sender=alice, to=carol.ref, text="while stopped"))
    assert unread_count(carol.id) == 3
    session_set_status(session=carol, status=SessionStatus.IDLE, actor=session_principal(carol))
    assert unread_count(carol.id) == 4
    assert_counts_match()

    # An exit expires what waits; deleting deliveries (or the session) takes them off.
    session_set_status(session=carol, status=SessionStatus.EXITED, actor=session_principal(carol))
    assert unread_count(carol.id) == 0
    Delivery.objects.filter(recipient=bob, state=S.QUEUED).order_by("id")[:1].get().delete()
    assert unread_count(bob.id) == 2
    bob.delete()
    assert_counts_match()


def share(recipient: AgentSession, sender: AgentSession) -> int:
    return shares_kept().get((recipient.id, sender.id), 0)


@pytest.mark.django_db
def test_each_senders_share_follows_its_deliveries_to_the_end() -> None:
    """The per-sender counts through failure, expiry, the hub's notices (no sender: not counted),
    retention, an operator deleting a sender's data and a sender's session purged."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from messaging.models import Message
    from messaging.principals import HUB
    from messaging.services.delivery import delivery_transition
    from messaging.services.notifications import Notice, notifications_send
    from messaging.services.retention import (
        messages_purge_expired,
        session_data_delete,
        sessions_purge_expired,
    )

    alice, bob, carol = (session_register(name=n).session for n in ("alice", "bob", "carol"))
    for i in range(4):
        message_send(SendRequest(sender=alice, to="bob", text=f"a{i}"))
        message_send(SendRequest(sender=carol, to="bob", text=f"c{i}"))
    message_send(SendRequest(sender=bob, to="alice", text="back"))
    with transaction.atomic():
        notifications_send([Notice(recipient_id=bob.id, text="from the hub")])
    assert (share(bob, alice), share(bob, carol), share(alice, bob), unread_count(bob.id)) == (4, 4, 1, 9)
    assert_counts_match()

    # Failed and expired deliveries leave the share; so does a read one.
    first, second, third = Delivery.objects.filter(recipient=bob, message__sender=alice).order_by("id")[:3]
    with transaction.atomic():
        delivery_transition(Delivery.objects.filter(pk=first.pk), to=S.FAILED, actor=HUB)
        delivery_transition(Delivery.objects.filter(pk=second.pk), to=S.EXPIRED, actor=HUB)
    inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=[str(third.message_id)])
    assert (share(bob, alice), share(bob, carol)) == (1, 4)
    assert_counts_match()

    # Retention takes final deliveries only: the share does not move.
    later = timezone.now() + timedelta(days=365)
    assert messages_purge_expired(now=later)[0] == 3
    assert (share(bob, alice), share(bob, carol)) == (1, 4)
    assert_counts_match()

    # An operator deletes Carol's data: her unread messages go, and her share with them.
    session_data_delete(session_id=carol.id, actor=OPERATOR)
    assert (share(bob, carol), unread_count(bob.id)) == (0, 2)
    assert_counts_match()

    # Alice exits and, past retention, is purged: her share row goes with her session, and Bob
    # reading her last message afterwards (now of no sender) leaves every count right.
    session_set_status(session=alice, status=SessionStatus.EXITED, actor=session_principal(alice))
    AgentSession.objects.filter(pk=alice.pk).update(last_seen=timezone.now() - timedelta(days=365))
    messages_purge_expired(now=later)  # Bob's message to her, expired by her exit
    assert sessions_purge_expired() == 1
    assert not UnreadShare.objects.filter(sender_id=alice.id).exists()
    orphan = Message.objects.get(text="a3")
    assert orphan.sender_id is None
    inbox_ack(recipient=bob, actor=session_principal(bob), message_ids=[str(orphan.id)])
    # (Bob's two notices from the hub are left: the first, and the one saying his message expired.)
    assert unread_count(bob.id) == 2 and not UnreadShare.objects.filter(sender_id=alice.id).exists()
    assert_counts_match()


@pytest.mark.django_db
def test_random_moves_keep_the_count() -> None:
    """300 random operations (sends, batches, pulls, acks, bulk state changes, deletes), the count
    checked against a real count after every tenth."""
    rng = random.Random(8)
    sessions = [session_register(name=f"agent{i}").session for i in range(4)]
    states = [S.QUEUED, S.DELIVERED, S.READ, S.HELD, S.EXPIRED, S.DENIED]
    for step in range(300):
        sender, recipient = rng.sample(sessions, 2)
        roll = rng.random()
        try:
            if roll < 0.35:
                message_send(SendRequest(sender=sender, to=recipient.ref, text=f"step {step}"))
            elif roll < 0.5:
                targets = rng.sample(sessions, 3)
                items = [{"to": t.ref, "text": f"step {step} to {t.name}"} for t in targets]
                messages_send_batch(sender=sender, items=items)
            elif roll < 0.65:
                inbox_pull(recipient=recipient, actor=session_principal(recipient), limit=rng.randint(1, 5))
            elif roll < 0.8:
                delivered = Delivery.objects.filter(recipient=recipient, state=S.DELIVERED)
                ids = [str(m) for m in delivered.values_list("message_id", flat=True)[: rng.randint(1, 4)]]
                if ids:
                    inbox_ack(recipient=recipient, actor=session_principal(recipient), message_ids=ids)
            elif roll < 0.93:
                ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
                some = rng.sample(ids, min(len(ids), rng.randint(1, 6)))
                Delivery.objects.filter(pk__in=some).update(state=rng.choice(states))
            else:
                ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
                if ids:
                    Delivery.objects.get(pk=rng.choice(ids)).delete()
        except SwitchboardError:
            pass  # a rule said no (a loop held, a self-send): nothing to count
        if step % 10 == 9:
            assert_counts_match()
    assert Delivery.objects.filter(state__in=UNREAD_STATES).exists()
    assert_counts_match()


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_in_opposite_orders_keep_exact_counts() -> None:
    """PostgreSQL: batches to two recipients, half in each order, and pulls, from 6 connections at
    once. Counts are written in recipient order, so none deadlocks, and they stay exact."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writer at a time")
    senders = [session_register(name=f"sender{i}").session for i in range(6)]
    a, b = session_register(name="left").session, session_register(name="right").session
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for round_ in range(15):
                pair = [a, b] if (i + round_) % 2 else [b, a]
                items = [{"to": r.ref, "text": f"{i}-{round_} to {r.name}"} for r in pair]
                outcomes = messages_send_batch(sender=senders[i], items=items)
                failures.extend(o for o in outcomes if isinstance(o, BaseException))
                if round_ % 3 == 2:
                    inbox_pull(recipient=pair[0], actor=session_principal(pair[0]), limit=3)
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert Delivery.objects.filter(recipient__in=[a, b]).count() == 6 * 15 * 2
    assert_counts_match()


@pytest.mark.django_db(transaction=True)
def test_upgrading_counts_the_deliveries_already_there() -> None:
    """A hub upgraded from before migration 0004 starts with the right counts."""
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    before = [("messaging", "0003_drop_indexes_covered_by_composites")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    Session, Message, OldDelivery = (
        old.get_model("messaging", m) for m in ("AgentSession", "Message", "Delivery")
    )
    now = timezone.now()

    def session(name: str) -> object:
        return Session.objects.create(
            name=name, name_key=name, ref=name[:6], token_hash=name * 8, last_seen=now, status_changed_at=now
        )

    alice, bob, carol = session("alice"), session("bob"), session("carol")
    states = {bob: [S.QUEUED, S.QUEUED, S.DELIVERED, S.READ, S.HELD], carol: [S.DELIVERED, S.EXPIRED]}
    for recipient, wanted in states.items():
        for i, state in enumerate(wanted):
            message = Message.objects.create(sender=alice, text=f"{state} {i}", size=1, sha256=f"{i}")
            OldDelivery.objects.create(message=message, recipient=recipient, state=state)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert (unread_count(bob.id), unread_count(carol.id), unread_count(alice.id)) == (3, 1, 0)
    assert_counts_match()
