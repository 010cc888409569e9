"""The bulk batch send (messaging.services.pipeline): the outcome of each item is the one a single
send gives, the database work does not grow with the batch, the audit keeps one event per step,
and a database failure accepts none of the batch."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
import time_machine
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging.errors import SwitchboardError
from messaging.models import AgentSession, AuditEvent, Delivery, Message, Pin
from messaging.principals import session_principal
from messaging.services.pipeline import message_send, messages_send, messages_send_batch
from messaging.services.request import SendRequest
from messaging.services.sending import SendOutcome
from teams.models import Observer

SECRET = "here is the key sk-ant-" + "a1B2c3D4e5F6g7H8i9J0k"


@pytest.fixture
def world(register: Any) -> dict[str, AgentSession]:
    """alice sends; bob accepts; carol holds; dave refuses; erin fills up; frank and alice are in
    a reply loop; olga is an observer; two sessions are named `twin`; gina is stopped (her messages are held for her)."""
    agents = {name: register(name) for name in ("alice", "bob", "carol", "dave", "erin", "frank", "olga")}
    register("twin"), register("twin")
    agents["gina"] = register("gina", status="stopped")
    AgentSession.objects.filter(pk=agents["carol"].id).update(inbound_policy="hold")
    AgentSession.objects.filter(pk=agents["dave"].id).update(inbound_policy="refuse")
    sessions = {name: AgentSession.objects.get(pk=agent.id) for name, agent in agents.items()}
    # olga observes bob (she receives nothing); frank has just sent alice two texts
    Observer.objects.create(session=sessions["olga"], target_session=sessions["bob"], registered_by="test")
    for i in range(2):
        message_send(SendRequest(sender=sessions["frank"], to="alice", text=f"frank to alice {i}"))
    return sessions


def mixed_items() -> list[dict[str, Any]]:
    return [
        {"to": "bob", "text": "hello bob"},  # 0 queued
        {"to": "carol", "text": "hello carol", "priority": "urgent"},  # 1 held by her policy
        {"to": "bob", "text": SECRET},  # 2 held as sensitive, escalate=required
        {"to": "dave", "text": "hello dave"},  # 3 refused by his policy
        {"to": "bob", "text": "   "},  # 4 invalid text
        {"to": "nobody", "text": "anyone there?"},  # 5 unknown address
        {"to": "twin", "text": "which one?"},  # 6 ambiguous address
        {"to": "bob", "text": "keyed", "idempotency_key": "k1"},  # 7 queued
        {"to": "bob", "text": "keyed", "idempotency_key": "k1"},  # 8 the same key again: 7
        {"to": "bob", "text": "earlier", "idempotency_key": "k-earlier"},  # 9 the earlier send
        {"to": "bob", "text": "different", "idempotency_key": "k1"},  # 10 same key, other text
        {"to": "bob", "text": "hello bob"},  # 11 same text within 60 s: 0
        {"to": "bob", "text": "said before"},  # 12 same text as a send before the batch
        {"to": "gina", "text": "hello gina"},  # 13 held for a stopped recipient
        {"to": "alice", "text": "note to self"},  # 14 a session cannot message itself
        *({"to": "erin", "text": f"erin {i}"} for i in range(8)),  # 15-22 unread cap, then pair rate
        *({"to": "frank", "text": f"frank {i}"} for i in range(3)),  # 23-25 the third is a loop
        {"to": "olga", "text": "observers receive nothing"},  # 26
        {"to": "bob", "text": "re: nothing", "in_reply_to": str(uuid.UUID(int=5))},  # 27 no such message
    ]


EXPECTED = [
    "queued",
    "held:own_policy",
    "held:sensitive",
    "refused",
    "invalid:empty_message",
    "not_found",
    "ambiguous",
    "queued",
    "queued duplicate",
    "queued duplicate",
    "idempotency_conflict",
    "queued duplicate",
    "queued duplicate",
    "held:recipient_stopped",
    "invalid:self_target",
    "queued",
    "queued",
    "queued",
    "queued",
    "rate_limited:recipient_queue_full",
    "rate_limited:recipient_queue_full",
    "rate_limited:pair_rate",
    "rate_limited:pair_rate",
    "queued",
    "queued",
    "held:loop_suspected",
    "forbidden:observer",
    "not_found:in_reply_to",
]


def label(result: SendOutcome | SwitchboardError) -> str:
    if isinstance(result, SwitchboardError):
        reason = result.extra.get("reason")
        return f"{result.code}:{reason}" if reason else result.code
    held = f":{result.delivery.hold_reason}" if result.delivery.hold_reason else ""
    return f"{result.status}{held}{' duplicate' if result.duplicate else ''}"


def view(results: list[Any], names: dict[Any, str]) -> list[Any]:
    """What a sender sees of each result, with message ids replaced by which send made them."""
    seen = []
    for i, result in enumerate(results):
        if isinstance(result, SwitchboardError):
            extra = {k: v for k, v in result.extra.items() if k != "message_id"}
            made = names.get(uuid.UUID(result.extra["message_id"])) if "message_id" in result.extra else None
            seen.append((result.code, result.detail, extra, made))
            continue
        if not result.duplicate:
            names[result.message.id] = f"item {i}"
        answer = result.as_dict() | {"id": names[result.message.id]}
        d = result.delivery
        seen.append((answer, d.hold_reason, d.escalate, d.priority, str(d.expires_at)))
    return seen


def run(world: dict[str, AgentSession], send_items: Any, settings: Any) -> tuple[list[str], list[Any]]:
    """Send two messages, then the items (with `send_items`), then probes that show what is left in
    the hub's bucket; return the labels and the view, then undo it all (buckets start afresh)."""
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    alice = world["alice"]
    sid = transaction.savepoint()
    names = {}
    for text, key in (("earlier", "k-earlier"), ("said before", None)):
        names[
            message_send(SendRequest(sender=alice, to="bob", text=text, idempotency_key=key)).message.id
        ] = text
    results = send_items(alice, mixed_items())
    probes = []
    for i in range(20):
        try:
            probes.append(message_send(SendRequest(sender=alice, to="carol", text=f"probe {i}")))
        except SwitchboardError as exc:
            probes.append(exc)
    seen = view(results, names), [label(p) for p in probes]
    labels = [label(r) for r in results]
    transaction.savepoint_rollback(sid)
    return labels, seen


def one_by_one(sender: AgentSession, items: list[dict[str, Any]]) -> list[Any]:
    results: list[Any] = []
    for item in items:
        try:
            results.append(message_send(SendRequest(sender=sender, **item)))
        except SwitchboardError as exc:
            results.append(exc)
    return results


def as_a_batch(sender: AgentSession, items: list[dict[str, Any]]) -> list[Any]:
    return messages_send_batch(sender=sender, items=items)


def test_each_item_of_a_batch_gets_the_outcome_a_single_send_gives(world, settings):
    # Given small limits: 6 per pair, 4 unread per recipient, 30 for the whole hub (periods with
    # whole-second token intervals, which Redis stores exactly)
    settings.SWITCHBOARD_RATE_PAIR, settings.SWITCHBOARD_RATE_PAIR_SECONDS = 6, 12
    settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS = 30, 30
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 4
    settings.SWITCHBOARD_LOOP_EXCHANGES = 2
    with time_machine.travel(timezone.now().replace(microsecond=0), tick=False):
        # When the same items are sent one by one, and (from the same start) as one batch
        single_labels, single = run(world, one_by_one, settings)
        batch_labels, batch = run(world, as_a_batch, settings)

    # Then the mix covers every rule
    assert single_labels == EXPECTED
    # And each batch item has the single send's outcome: state, reasons, tier, trust, sentence,
    # duplicate of which send, the same error and detail; and the hub's bucket is left the same
    assert batch_labels == single_labels
    assert batch == single


def group_sends() -> list[tuple[str, dict[str, Any]]]:
    """Alice's mix among other senders' sends that change what she reads: frank's third text to
    her (with a loop threshold of 3, her third text to frank makes a loop only after it), sends to erin
    that fill her unread cap before alice's, bob's key "k1" (keys are per sender), carol's text
    to bob."""
    return [
        ("frank", {"to": "alice", "text": "frank to alice 2"}),
        ("bob", {"to": "erin", "text": "bob to erin"}),
        ("alice", {"to": "frank", "text": "alice to frank before her mix"}),
        *(("alice", item) for item in mixed_items()),
        ("frank", {"to": "erin", "text": "frank to erin"}),
        ("bob", {"to": "alice", "text": "keyed", "idempotency_key": "k1"}),
        ("carol", {"to": "bob", "text": "hello bob"}),
        ("bob", {"to": "carol", "text": "and back", "idempotency_key": "k-b"}),
    ]


def in_sender_order(sends: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """The positions of `sends`, each sender's in their order, senders as they first appear."""
    first: dict[str, int] = {}
    for position, (name, _fields) in enumerate(sends):
        first.setdefault(name, position)
    return sorted(range(len(sends)), key=lambda p: (first[sends[p][0]], p))


def test_a_group_of_senders_gets_the_outcomes_of_their_sends_one_by_one(world, settings):
    # Given small limits (as above), and a loop at three texts each way
    settings.SWITCHBOARD_RATE_PAIR, settings.SWITCHBOARD_RATE_PAIR_SECONDS = 6, 12
    settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS = 40, 40
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 4
    settings.SWITCHBOARD_LOOP_EXCHANGES = 3
    sends = group_sends()

    def one_by_one_in_sender_order(_alice: AgentSession, _items: Any) -> list[Any]:
        results: list[Any] = [None] * len(sends)
        for position in in_sender_order(sends):
            name, fields = sends[position]
            try:
                results[position] = message_send(SendRequest(sender=world[name], **fields))
            except SwitchboardError as exc:
                results[position] = exc
        return results

    def together(_alice: AgentSession, _items: Any) -> list[Any]:
        group = [SendRequest(sender=world[n], actor=session_principal(world[n]), **f) for n, f in sends]
        return messages_send(group)

    with time_machine.travel(timezone.now().replace(microsecond=0), tick=False):
        # When the sends go one by one, each sender's in turn, and (from the same start) as one group
        single_labels, single = run(world, one_by_one_in_sender_order, settings)
        group_labels, group = run(world, together, settings)

    # Then the other senders' sends changed alice's outcomes: erin's inbox was full sooner, and
    # alice's texts to frank became a loop
    alice_labels = single_labels[3 : 3 + len(mixed_items())]
    assert alice_labels[15:19] == ["queued", "queued"] + ["rate_limited:recipient_queue_full"] * 2
    assert alice_labels[23:26] == ["queued", "queued", "held:loop_suspected"]
    # And each send of the group has the outcome it had one by one, and the hub's bucket is the same
    assert group_labels == single_labels
    assert group == single


def test_a_batch_reads_the_database_the_same_number_of_times_for_10_or_100_messages(
    world, settings, django_assert_max_num_queries
):
    settings.SWITCHBOARD_RATE_PAIR = settings.SWITCHBOARD_RATE_HUB = 100_000
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 100_000
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 100_000
    alice, names = world["alice"], ("bob", "carol", "dave")
    AgentSession.objects.filter(name__in=names).update(inbound_policy=None)

    def batch(n: int, tag: str) -> tuple[int, int]:
        items = [
            {"to": names[i % 3], "text": f"{tag} {i}", "idempotency_key": f"{tag}-{i}"} for i in range(n)
        ]
        with CaptureQueriesContext(connection) as queries:
            results = messages_send_batch(sender=alice, items=items)
        assert [label(r) for r in results] == ["queued"] * n
        writes = sum("INSERT INTO" in q["sql"].upper() for q in queries.captured_queries)
        return len(queries.captured_queries) - writes, writes

    batch(3, "warm-up")  # the first batch pins the three names
    reads_10, inserts_10 = batch(10, "ten")
    reads_100, inserts_100 = batch(100, "hundred")

    # Reads, locks, pins and counts: once per batch, distinct address or recipient
    assert reads_100 == reads_10
    # Writes: on PostgreSQL one statement for messages, deliveries and audit events together;
    # elsewhere one per table (3), or as few as SQLite's 999-parameter limit allows
    if connection.vendor == "postgresql":
        assert inserts_10 == inserts_100 == 1
    else:
        assert inserts_10 == 3 and inserts_100 <= 8
    assert Message.objects.filter(sender=alice).count() == 113


def test_a_batch_leaves_a_pin_that_already_points_at_the_recipient_as_it_is(world, settings):
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    alice = world["alice"]
    message_send(SendRequest(sender=alice, to="bob", text="the first send pins the name"))
    pin = Pin.objects.get(sender=alice, name_key="bob")
    pin_table = connection.ops.quote_name(Pin._meta.db_table)

    with CaptureQueriesContext(connection) as queries:
        results = messages_send_batch(
            sender=alice, items=[{"to": "bob", "text": f"again {i}"} for i in range(3)]
        )

    assert [label(r) for r in results] == ["queued"] * 3
    # The pin is read with the address, and neither locked nor written again
    touching = [q["sql"] for q in queries.captured_queries if pin_table in q["sql"]]
    assert len(touching) == 1 and touching[0].lstrip().upper().startswith("SELECT")
    assert "FOR UPDATE" not in touching[0].upper()
    assert Pin.objects.get(pk=pin.pk).updated_at == pin.updated_at


def test_a_batch_writes_the_pin_its_last_rebinding_leaves(world, settings):
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    alice = world["alice"]
    first, second = AgentSession.objects.filter(name="twin").order_by("ref")
    message_send(SendRequest(sender=alice, to=f"twin [{first.ref}]", text="pins twin to the first"))

    # Pinned to the first: away to the second, then back to the first, within one batch
    addresses = [f"twin [{first.ref}]", f"twin [{second.ref}]", f"twin [{first.ref}]"]
    results = messages_send_batch(
        sender=alice, items=[{"to": a, "text": f"to {a} at {i}"} for i, a in enumerate(addresses)]
    )

    assert [r.recipient.id for r in results] == [first.id, second.id, first.id]
    assert Pin.objects.get(sender=alice, name_key="twin").recipient_id == first.id
    # Away to the second in a batch of its own: the pin follows
    messages_send_batch(sender=alice, items=[{"to": f"twin [{second.ref}]", "text": "only the second"}])
    assert Pin.objects.get(sender=alice, name_key="twin").recipient_id == second.id


def test_a_batch_audits_one_acceptance_and_one_delivery_event_per_message(world, settings):
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    alice = world["alice"]
    message_send(SendRequest(sender=alice, to="bob", text="earlier", idempotency_key="k-earlier"))
    before = AuditEvent.objects.count()

    results = messages_send_batch(sender=alice, items=mixed_items()[:14])

    accepted = [r for r in results if isinstance(r, SendOutcome) and not r.duplicate]
    assert len(accepted) == 7
    events = list(AuditEvent.objects.order_by("id")[before:])
    assert len(events) == 2 * len(accepted)
    for outcome in accepted:
        mine = [e for e in events if e.message_id == outcome.message.id]
        assert [e.kind for e in mine] == ["message.accepted", f"delivery.{outcome.status}"]
        assert mine[1].delivery_id == outcome.delivery.pk
        assert mine[0].length == outcome.message.size and mine[0].sha256 == outcome.message.sha256
        assert all(e.target == str(outcome.recipient.id) and e.actor.startswith("session:") for e in mine)
    assert mine[0].detail == {"to": "gina", "rule": "name", "kind": "text"}
    assert mine[1].detail == {"from": "accepted", "reason": "recipient_stopped"}


def test_a_database_failure_accepts_none_of_the_batch(world, settings, monkeypatch):
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    counts = (
        Message.objects.count(),
        Delivery.objects.count(),
        AuditEvent.objects.count(),
        Pin.objects.count(),
    )

    def broken(*args: Any, **kwargs: Any) -> None:
        raise DatabaseError("disk full")

    # Fails after every row of the batch was written, inside its transaction.
    monkeypatch.setattr("messaging.services.pipeline.schedule_pushes", broken)
    items = [
        {"to": "gina", "text": "held while she is stopped"},  # written first: the stopped-hold caps count it
        {"to": "bob", "text": "one"},
        {"to": "carol", "text": "two"},
    ]
    with pytest.raises(DatabaseError):
        messages_send_batch(sender=world["alice"], items=items)

    after = (
        Message.objects.count(),
        Delivery.objects.count(),
        AuditEvent.objects.count(),
        Pin.objects.count(),
    )
    assert after == counts


def test_a_batch_counts_the_texts_sent_before_it_toward_a_reply_loop(world, settings):
    # Given frank has sent alice two texts (the fixture) and alice has sent him one
    settings.SWITCHBOARD_LOOP_EXCHANGES = 2
    message_send(SendRequest(sender=world["alice"], to="frank", text="before the batch"))

    # When alice sends him two more in one batch
    items = [{"to": "frank", "text": f"in the batch {i}"} for i in range(2)]
    results = messages_send_batch(sender=world["alice"], items=items)

    # Then the second makes two texts each way within the window: a loop, as a single send says
    assert [label(r) for r in results] == ["queued", "held:loop_suspected"]


def test_a_group_counts_what_earlier_senders_sent_toward_the_unread_cap_and_a_loop(world, settings):
    # Given a cap of 4 unread and a loop at three texts each way (frank has sent alice two)
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    settings.SWITCHBOARD_RATE_PAIR = settings.SWITCHBOARD_RATE_HUB = 10_000
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 4
    settings.SWITCHBOARD_LOOP_EXCHANGES = 3
    sends = [
        ("frank", {"to": "alice", "text": "frank's third"}),
        ("bob", {"to": "erin", "text": "bob 1"}),
        ("bob", {"to": "erin", "text": "bob 2"}),
        ("carol", {"to": "erin", "text": "carol 1"}),
        *(("alice", {"to": "frank", "text": f"alice to frank {i}"}) for i in range(4)),
        ("alice", {"to": "erin", "text": "alice 1"}),
        ("alice", {"to": "erin", "text": "alice 2"}),
    ]

    # When they go as one group
    group = [SendRequest(sender=world[n], actor=session_principal(world[n]), **f) for n, f in sends]
    labels = [label(r) for r in messages_send(group)]

    # Then alice's fourth text to frank is a loop (frank's third text, in the group, counts), and
    # erin's inbox is full for alice's second (bob's and carol's, in the group, count)
    assert labels == ["queued"] * 7 + ["held:loop_suspected", "queued", "rate_limited:recipient_queue_full"]


def test_every_kind_of_item_is_written_with_the_others(world, settings):
    """A held message for a stopped recipient, one with a file and a plain text go through the one
    pipeline and are written together: one INSERT for the messages of the whole batch, each with
    the outcome and the rows a single send gives it."""
    from federation.models import FileUpload, MessageAttachment
    from federation.services.files import file_store

    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    stored = file_store(data=b"the report")
    FileUpload.objects.create(
        session_id=world["alice"].id, attachment=stored, size=stored.size, uploaded_at=timezone.now()
    )
    items = [
        {"to": "gina", "text": "held while she is stopped"},
        {"to": "bob", "text": "see the file", "files": [{"sha256": stored.sha256, "name": "report.md"}]},
        {"to": "alice", "text": "to myself"},
        {"to": "bob", "text": "and a plain one"},
    ]
    with CaptureQueriesContext(connection) as queries:
        results = messages_send_batch(sender=world["alice"], items=items)

    assert [label(r) for r in results] == [
        "held:recipient_stopped",
        "queued",
        "invalid:self_target",
        "queued",
    ]
    into_messages = re.compile(rf'INSERT INTO "?{Message._meta.db_table}"?[\s(]', re.IGNORECASE)
    assert sum(bool(into_messages.search(q["sql"])) for q in queries.captured_queries) == 1
    [attached] = MessageAttachment.objects.filter(message_id=results[1].message.id)
    assert attached.attachment_id == stored.pk and attached.name == "report.md"


def test_a_file_that_cannot_be_attached_fails_its_item_alone(world, settings):
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-batch-{uuid.uuid4().hex}"
    items = [
        {"to": "bob", "text": "before"},
        {"to": "bob", "text": "a file nobody uploaded", "files": [{"sha256": "0" * 64, "name": "ghost.md"}]},
        {"to": "bob", "text": "after"},
    ]
    results = messages_send_batch(sender=world["alice"], items=items)
    assert [label(r) for r in results] == ["queued", "not_found", "queued"]
    sent = Message.objects.filter(sender=world["alice"]).values_list("text", flat=True)
    assert sorted(sent) == ["after", "before"]
