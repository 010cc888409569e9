"""Concurrent single sends go together, whoever sends them (messaging.services.together): the
first alone, the ones that arrived while it ran as one group, each answered with its own outcome
or error."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import OperationalError, connection

from messaging.errors import Invalid
from messaging.models import Message
from messaging.principals import session_principal
from messaging.services import together
from messaging.services.request import SendRequest
from messaging.services.sending import SendOutcome
from messaging.services.together import SendsTogether, message_send_together

WAIT = 10  # seconds any test thread waits at most


@dataclass
class FakeSender:
    id: uuid.UUID
    name: str = "alice"


class FakeActor:
    def __init__(self, actor: str) -> None:
        self.actor = actor


class Recorder:
    """Stands in for `messages_send`: records each call ("alone" for a group of one), answers each
    request with its text (or an error for texts starting "bad"), and holds the first call until told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.fail_groups = False
        self.short_groups = False  # answers one outcome too few: a broken group
        self._lock = threading.Lock()

    def _hold_if_first(self) -> None:
        with self._lock:
            first = not self.first_started.is_set()
            self.first_started.set()
        if first:
            assert self.release_first.wait(WAIT)

    def send(self, requests: list[SendRequest]) -> list[Any]:
        texts = [request.text for request in requests]
        with self._lock:
            self.calls.append(("alone" if len(texts) == 1 else "group", texts))
        self._hold_if_first()
        if self.fail_groups and len(texts) > 1:
            raise OperationalError("the database went away")
        if self.short_groups and len(texts) > 1:
            return [("sent", text) for text in texts[1:]]
        return [Invalid("bad_text", "no") if text.startswith("bad") else ("sent", text) for text in texts]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    fake = Recorder()
    monkeypatch.setattr(together, "messages_send", fake.send)
    return fake


def _request(sender: Any, text: str, actor: str = "a") -> SendRequest:
    return SendRequest(sender=sender, actor=FakeActor(actor), to="bob", text=text)  # type: ignore[arg-type]


def _queued_behind(hub: SendsTogether, count: int) -> None:
    """Wait until `count` sends are waiting behind the running group."""
    for _ in range(WAIT * 100):
        if hub.waiting() >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{count} sends never queued")


def _start(
    pool: ThreadPoolExecutor, hub: SendsTogether, sender: FakeSender, text: str, actor: str = "a"
) -> Any:
    return pool.submit(hub.send, _request(sender, text, actor))


def _result(future: Any) -> Any:
    try:
        return future.result(WAIT)
    except Exception as exc:  # the error the send raised in its own thread
        return type(exc).__name__


def _first_held_while_more_queue(
    recorder: Recorder, hub: SendsTogether, sender: FakeSender, texts: list[str]
) -> list[Any]:
    """Send "one" and hold it until every one of `texts` waits behind it, then let it go; the
    results of all, "one" first."""
    with ThreadPoolExecutor(len(texts) + 1) as pool:
        first = _start(pool, hub, sender, "one")
        assert recorder.first_started.wait(WAIT)
        rest = [_start(pool, hub, sender, text) for text in texts]
        _queued_behind(hub, len(texts))
        recorder.release_first.set()
        return [_result(f) for f in (first, *rest)]


def test_sends_that_arrive_while_one_runs_go_together_after_it(recorder: Recorder) -> None:
    hub, alice = SendsTogether(), FakeSender(uuid.uuid4())
    results = _first_held_while_more_queue(recorder, hub, alice, ["two", "bad three", "four"])

    # The first went alone; the three that waited went as one group, in the order they came
    assert recorder.calls[0] == ("alone", ["one"])
    assert recorder.calls[1][0] == "group" and sorted(recorder.calls[1][1]) == ["bad three", "four", "two"]
    assert len(recorder.calls) == 2
    # Each answered with its own outcome, or raised its own error
    assert results == [("sent", "one"), ("sent", "two"), "Invalid", ("sent", "four")]
    assert hub.idle()  # nothing left running or waiting


def test_a_lone_send_goes_by_itself_and_raises_its_own_error(recorder: Recorder) -> None:
    recorder.release_first.set()
    hub, alice = SendsTogether(), FakeSender(uuid.uuid4())

    assert hub.send(_request(alice, "hi")) == ("sent", "hi")
    with pytest.raises(Invalid):
        hub.send(_request(alice, "bad"))
    assert recorder.calls == [("alone", ["hi"]), ("alone", ["bad"])]
    assert hub.idle()


def test_other_senders_and_other_actors_go_together_with_them(recorder: Recorder) -> None:
    hub, alice, bob = SendsTogether(), FakeSender(uuid.uuid4()), FakeSender(uuid.uuid4(), "bob")
    with ThreadPoolExecutor(4) as pool:
        held = _start(pool, hub, alice, "alice holds")
        assert recorder.first_started.wait(WAIT)
        # bob, and alice acting as someone else, wait while alice's first send runs
        from_bob = _start(pool, hub, bob, "from bob")
        as_operator = _start(pool, hub, alice, "as operator", actor="operator:x")
        _queued_behind(hub, 2)
        recorder.release_first.set()
        assert _result(held) == ("sent", "alice holds")
        assert _result(from_bob) == ("sent", "from bob")
        assert _result(as_operator) == ("sent", "as operator")
    # and then go as one group, each with its own sender and actor
    assert recorder.calls[0] == ("alone", ["alice holds"])
    assert recorder.calls[1][0] == "group" and sorted(recorder.calls[1][1]) == ["as operator", "from bob"]
    assert hub.idle()


@pytest.mark.parametrize(
    ("broken", "error"),
    [("fail_groups", "OperationalError"), ("short_groups", "RuntimeError")],
    ids=["the group raised", "the group answered too few outcomes"],
)
def test_a_failed_group_is_every_members_error_and_hangs_none(
    recorder: Recorder, broken: str, error: str
) -> None:
    """A group that raises, or (never expected) answers fewer outcomes than it was given, fails
    every member of its group with one error, leaves none waiting, and the sender can send again."""
    hub, alice = SendsTogether(), FakeSender(uuid.uuid4())
    setattr(recorder, broken, True)
    first, *rest = _first_held_while_more_queue(recorder, hub, alice, [f"more {i}" for i in range(3)])
    assert first == ("sent", "one")
    assert rest == [error] * 3
    assert hub.idle()
    setattr(recorder, broken, False)
    assert hub.send(_request(alice, "after")) == ("sent", "after")


def test_with_two_groups_in_flight_a_second_send_does_not_wait_for_the_first(recorder: Recorder) -> None:
    hub, alice = SendsTogether(in_flight=2), FakeSender(uuid.uuid4())
    with ThreadPoolExecutor(4) as pool:
        held = _start(pool, hub, alice, "one")
        assert recorder.first_started.wait(WAIT)
        assert _result(_start(pool, hub, alice, "two")) == ("sent", "two")  # while "one" is held
        recorder.release_first.set()
        assert _result(held) == ("sent", "one")
    assert recorder.calls == [("alone", ["one"]), ("alone", ["two"])]
    assert hub.idle()


def test_no_group_is_larger_than_its_maximum(recorder: Recorder) -> None:
    hub, alice = SendsTogether(group_max=2), FakeSender(uuid.uuid4())
    results = _first_held_while_more_queue(recorder, hub, alice, [f"m{i}" for i in range(5)])
    assert results == [("sent", "one")] + [("sent", f"m{i}") for i in range(5)]
    sizes = [len(texts) for _, texts in recorder.calls]
    assert sizes[0] == 1 and all(size <= 2 for size in sizes) and sum(sizes) == 6


class FakeConnection:
    """Stands in for Django's connection in `together`: counts the connections handed back."""

    def __init__(self, *, pooled: bool, in_atomic_block: bool = False) -> None:
        self.pool = object() if pooled else None
        self.in_atomic_block = in_atomic_block
        self.closed = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self.closed += 1


@pytest.mark.parametrize(
    ("pooled", "in_atomic_block", "given_back"),
    [(True, False, 3), (False, False, 0), (True, True, 0)],
    ids=["pooled", "not pooled (SQLite)", "in a transaction"],
)
def test_a_waiting_send_hands_its_pooled_database_connection_back(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch, pooled: bool, in_atomic_block: bool, given_back: int
) -> None:
    """Each of the three sends that wait for a group gives its pooled connection back before
    waiting, so the sends arriving meanwhile find one to check their token with; the send that
    runs keeps its own. A connection that is not pooled, or is in a transaction, is kept."""
    fake = FakeConnection(pooled=pooled, in_atomic_block=in_atomic_block)
    monkeypatch.setattr(together, "connection", fake)
    hub, alice = SendsTogether(), FakeSender(uuid.uuid4())
    results = _first_held_while_more_queue(recorder, hub, alice, ["two", "three", "four"])
    assert results == [("sent", text) for text in ("one", "two", "three", "four")]
    assert fake.closed == given_back


@pytest.mark.django_db(transaction=True)
def test_concurrent_sends_of_one_sender_each_get_their_own_message(
    register: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SWITCHBOARD_RATE_PAIR = settings.SWITCHBOARD_RATE_HUB = 10_000
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 10_000
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 10_000
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-together-{uuid.uuid4().hex}"
    alice, _bob = register("alice"), register("bob")
    from messaging.models import AgentSession

    sender = AgentSession.objects.get(pk=alice.id)
    actor = session_principal(sender)
    hub = SendsTogether()
    monkeypatch.setattr(together, "_together", hub)
    # The first send waits until three more are queued behind it, so a group surely forms
    real_send, groups = together.messages_send, []

    def send_group(requests: list[SendRequest]) -> list[Any]:
        if not groups:
            _queued_behind(hub, 3)
        groups.append(len(requests))
        return real_send(requests)

    monkeypatch.setattr(together, "messages_send", send_group)

    def send(i: int) -> SendOutcome:
        try:
            return message_send_together(
                SendRequest(
                    sender=sender, actor=actor, to="bob", text=f"note {i % 5}", idempotency_key=f"k{i % 5}"
                )
            )
        finally:
            connection.close()

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(send, range(30)))

    assert sum(groups) == 30 and max(groups) >= 3
    # One message per idempotency key; every send with that key is answered with it
    stored = {m.idempotency_key: m for m in Message.objects.filter(sender_id=alice.id)}
    assert sorted(stored) == [f"k{i}" for i in range(5)]
    for i, outcome in enumerate(outcomes):
        original = stored[f"k{i % 5}"]
        assert outcome.message.id == original.id and original.text == f"note {i % 5}"
        assert outcome.status == "queued"
    assert sum(not o.duplicate for o in outcomes) == 5


@pytest.mark.django_db(transaction=True)
def test_concurrent_sends_of_many_senders_go_together_and_keep_each_pairs_order(
    register: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four sessions in a ring, each sending its neighbour ten texts one after another, all at
    once: sends of different senders are written in one group, and each recipient's inbox holds
    its sender's texts in the order they were sent."""
    settings.SWITCHBOARD_RATE_PAIR = settings.SWITCHBOARD_RATE_HUB = 10_000
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 10_000
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 10_000
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-together-{uuid.uuid4().hex}"
    from messaging.models import AgentSession, Delivery

    names = ["ann", "ben", "cat", "dan"]
    sessions = [AgentSession.objects.get(pk=register(name).id) for name in names]
    hub = SendsTogether()
    monkeypatch.setattr(together, "_together", hub)
    real_send, groups = together.messages_send, []

    def send_group(requests: list[SendRequest]) -> list[Any]:
        if not groups:  # the first send waits until the other three senders queue behind it
            _queued_behind(hub, 3)
        groups.append({request.sender.id for request in requests})
        return real_send(requests)

    monkeypatch.setattr(together, "messages_send", send_group)

    def sender(i: int) -> list[str]:
        me, partner = sessions[i], names[(i + 1) % 4]
        try:
            actor = session_principal(me)
            return [
                message_send_together(
                    SendRequest(sender=me, actor=actor, to=partner, text=f"{me.name} {k}")
                ).status
                for k in range(10)
            ]
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        states = list(pool.map(sender, range(4)))

    assert states == [["queued"] * 10] * 4
    assert max(len(senders) for senders in groups) >= 2  # at least one group of several senders
    for i, recipient in enumerate(sessions):
        partner = sessions[(i - 1) % 4]
        inbox = (
            Delivery.objects.filter(recipient=recipient)
            .order_by("id")
            .values_list("message__text", flat=True)
        )
        assert list(inbox) == [f"{partner.name} {k}" for k in range(10)]
