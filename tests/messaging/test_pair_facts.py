"""`pair_facts`: everything a send decides on about a sender → recipient pair, in one query.

Run on SQLite by the fast suite and on PostgreSQL by the PG stage (the statement is plain SQL)."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging.models import Delivery, Message, Pin, SenderPolicy
from messaging.services.pair import PairFacts, pair_facts
from messaging.services.pipeline import message_send
from messaging.services.request import HUB_MADE, SendRequest
from messaging.services.sessions import session_register
from messaging.states import DeliveryState
from tests.messaging.plans import plan_nodes, rows_read, the_one_statement

pytestmark = pytest.mark.django_db


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_new_pair_has_no_facts(pair) -> None:
    alice, bob = pair
    facts = pair_facts(sender=alice, recipient=bob, sha256=sha("hi"), now=timezone.now(), pin_key="bob")
    assert facts.duplicate_of is None and facts.unread == 0 and facts.policy is None
    assert not (facts.sender_is_observer or facts.recipient_is_observer or facts.policy_by_operator)
    assert (facts.loop_replies, facts.loop_sends, facts.pinned_to) == (0, 0, None)


def test_duplicates_unread_pins_and_policies_are_read(pair, settings) -> None:
    alice, bob = pair
    first = message_send(SendRequest(sender=alice, to="bob", text="same words"))
    message_send(SendRequest(sender=alice, to="bob", text="other words"))
    SenderPolicy.objects.create(recipient=bob, sender=alice, action="hold", by_operator=True)
    now = timezone.now()

    facts = pair_facts(sender=alice, recipient=bob, sha256=sha("same words"), now=now, pin_key="bob")

    assert facts.duplicate_of == first.message.id
    assert facts.unread == 2
    assert (facts.policy, facts.policy_by_operator) == ("hold", True)
    assert facts.pinned_to == bob.id == Pin.objects.get(sender=alice).recipient_id
    # Read messages no longer count; an old identical text is outside the dedupe window.
    Delivery.objects.filter(recipient=bob).update(state=DeliveryState.READ)
    Message.objects.filter(pk=first.message.id).update(created_at=now - timedelta(hours=1))
    later = pair_facts(sender=alice, recipient=bob, sha256=sha("same words"), now=now)
    assert later.unread == 0 and later.duplicate_of is None and later.pinned_to is None


def test_loop_counts_stop_at_their_limit(pair, settings) -> None:
    alice, bob = pair
    for i in range(4):
        message_send(SendRequest(sender=alice, to="bob", text=f"there {i}"))
        message_send(SendRequest(sender=bob, to="alice", text=f"back {i}"))
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 3
    settings.SWITCHBOARD_LOOP_EXCHANGES = 2

    facts = pair_facts(sender=alice, recipient=bob, sha256=sha("x"), now=timezone.now())

    assert facts.unread == 4  # exact: kept by the database, not counted (test_unread_counts)
    assert (facts.loop_replies, facts.loop_sends) == (2, 2)  # 4 each way, counted up to 2


def test_the_senders_own_direction_is_counted_only_when_the_replies_reach_the_threshold(
    pair, settings
) -> None:
    alice, bob = pair
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 100
    settings.SWITCHBOARD_LOOP_EXCHANGES = 2
    for i in range(3):
        message_send(SendRequest(sender=alice, to="bob", text=f"one way {i}"))
    message_send(SendRequest(sender=bob, to="alice", text="one reply"))

    one_way = pair_facts(sender=alice, recipient=bob, sha256=sha("x"), now=timezone.now())
    message_send(SendRequest(sender=bob, to="alice", text="a second reply"))
    both_ways = pair_facts(sender=alice, recipient=bob, sha256=sha("x"), now=timezone.now())

    # Alice's sends are not read while Bob's replies cannot make a loop: no loop either way.
    assert (one_way.loop_replies, one_way.loop_sends) == (1, 0)
    assert (both_ways.loop_replies, both_ways.loop_sends) == (2, 2)


def test_observers_are_seen_on_either_side(pair) -> None:
    from teams.models import Observer

    alice, bob = pair
    Observer.objects.create(session=bob, target_session=alice, registered_by="test")
    facts = pair_facts(sender=alice, recipient=bob, sha256=sha("x"), now=timezone.now())
    back = pair_facts(sender=bob, recipient=alice, sha256=sha("x"), now=timezone.now())
    assert facts.recipient_is_observer and not facts.sender_is_observer
    assert back.sender_is_observer and not back.recipient_is_observer


def test_a_plain_send_reads_the_pair_in_one_query(pair) -> None:
    alice, _bob = pair
    message_send(SendRequest(sender=alice, to="bob", text="first: pins bob"))
    with CaptureQueriesContext(connection) as queries:
        message_send(SendRequest(sender=alice, to="bob", text="second"))
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    # One to find bob among the candidates, one for every fact about the pair.
    assert len(reads) == 2, reads


def test_the_token_lookup_compiles_no_query_per_call(monkeypatch) -> None:
    """Every authenticated call looks its token up; the SQL is compiled once, not per call."""
    from django.db.models.sql.compiler import SQLCompiler

    from messaging.services.sessions import session_from_token

    registration = session_register(name="alice")
    session_from_token(registration.token)  # the first call may compile
    compiled: list[object] = []
    real = SQLCompiler.as_sql
    monkeypatch.setattr(
        SQLCompiler, "as_sql", lambda self, *a, **k: compiled.append(1) or real(self, *a, **k)
    )

    found = session_from_token(registration.token)

    assert found is not None and found.id == registration.session.id
    assert session_from_token("sbs_" + "x" * 40) is None
    assert compiled == []


def test_rows_read_with_compiled_sql_equal_what_the_orm_reads() -> None:
    """`models_selected` (used by the token lookup and the candidate query) converts each column
    as the ORM does: UUIDs, datetimes, booleans and choices come back with the same types."""
    from messaging.models import AgentSession
    from messaging.services.bulk import models_selected

    session_register(name="alice", headless=True)
    session_register(name="bob")
    queryset = AgentSession.objects.filter(name__in=["alice", "bob"]).order_by("name")
    sql, params = queryset.query.sql_with_params()

    selected = models_selected(AgentSession, sql, list(params))
    expected = list(queryset)

    assert [s.pk for s in selected] == [s.pk for s in expected] and len(selected) == 2
    for got, want in zip(selected, expected, strict=True):
        for field in AgentSession._meta.concrete_fields:
            mine, theirs = getattr(got, field.attname), getattr(want, field.attname)
            assert (mine, type(mine)) == (theirs, type(theirs)), field.attname
        assert got._state.adding is False and got._state.db == want._state.db


def test_the_dedupe_key_is_the_migrations_formula_and_is_written_with_every_message(pair) -> None:
    import importlib

    from messaging.services.notifications import Notice, notifications_send
    from messaging.services.pair import dedupe_key
    from messaging.services.pipeline import messages_send_batch

    migration = importlib.import_module("messaging.migrations.0005_dedupe_key")
    alice, bob = pair
    assert dedupe_key(alice.id, sha("x")) == migration.dedupe_key(alice.id, sha("x"))
    assert dedupe_key(alice.id, sha("x")) != dedupe_key(bob.id, sha("x")) != dedupe_key(bob.id, sha("y"))

    single = message_send(SendRequest(sender=alice, to="bob", text="one")).message
    batched = messages_send_batch(sender=alice, items=[{"to": "bob", "text": "two"}])[0].message
    notifications_send([Notice(recipient_id=bob.id, text="from the hub")])
    keys = dict(Message.objects.values_list("text", "dedupe_key"))
    assert keys == {
        "one": dedupe_key(alice.id, single.sha256),
        "two": dedupe_key(alice.id, batched.sha256),
        "from the hub": "",
    }


def _pair_read(**arguments: Any) -> tuple[PairFacts, tuple[str, list]]:
    """`pair_facts(**arguments)`, and the statement and parameters it ran."""
    return the_one_statement(lambda: pair_facts(**arguments))


def _rows_filtered_out(sql: str, params: list, **how: Any) -> int:
    """The most rows any node of `sql`'s plan read and then dropped (EXPLAIN ANALYZE; `how`: as
    `_plan_nodes` takes it)."""
    return max(node.get("Rows Removed by Filter", 0) for node in plan_nodes(sql, params, **how))


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_a_busy_new_sender_s_dedupe_lookup_reads_one_index_entry_per_text(busy_new_sender, mode: str) -> None:
    """PostgreSQL's statistics take a sender they have not seen for a rare one. The dedupe lookup
    must not read every message such a sender wrote within the window (it did, through
    `message_sender_recent`, when it asked for the sender and the text apart), under the plans
    the prepared pair read may run with."""
    from messaging.services.pair import _statement, dedupe_key
    from messaging.services.pipeline import RECENT_TEXTS_SQL

    alice, bob = busy_new_sender
    now = timezone.now()
    since = now - timedelta(seconds=60)

    # The single send's read (`pair_facts`), with its parameters as pair_facts passes them.
    _facts, (sql, params) = _pair_read(sender=alice, recipient=bob, sha256=sha("busy 299 again"), now=now)
    assert sql == _statement()
    assert _rows_filtered_out(sql, params, mode=mode) < 10

    # The batch's read, for 100 texts.
    keys = [dedupe_key(alice.id, sha(f"new {j}")) for j in range(100)]
    assert _rows_filtered_out(RECENT_TEXTS_SQL, [keys, "text", since], prepare=False) < 10


@pytest.mark.parametrize("texts", [1, 10, 1000])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("history", ["busy_new_sender", "sender_after_empty_statistics"])
def test_the_batch_s_dedupe_lookup_probes_each_text_under_any_plan(
    request: pytest.FixtureRequest, history: str, mode: str, texts: int
) -> None:
    """The batch's lookup is prepared like every other statement of a send, so PostgreSQL may
    run it with a generic plan, made without knowing how many texts the array holds. Under
    either kind of plan, for one text or a full batch, with statistics that take the sender for
    a rare one or the tables for empty, it reads the sender's messages only through
    `message_dedupe_key`, one probe per text, and each match's delivery by its message."""
    from messaging.services.pair import dedupe_key
    from messaging.services.pipeline import RECENT_TEXTS_SQL

    alice, _bob = request.getfixturevalue(history)
    since = timezone.now() - timedelta(seconds=60)
    sent_again = ["busy 0", "busy 150", "busy 299"][: max(1, texts // 2)]  # texts she sent before
    asked = sent_again + [f"new {j}" for j in range(texts - len(sent_again))]
    keys = [dedupe_key(alice.id, sha(text)) for text in asked]

    nodes = plan_nodes(RECENT_TEXTS_SQL, [keys, "text", since], mode=mode)

    scans = {node["Relation Name"]: node for node in nodes if "Relation Name" in node}
    assert scans["messaging_message"].get("Index Name") == "message_dedupe_key", scans["messaging_message"]
    assert rows_read(scans["messaging_message"]) <= len(sent_again)
    assert scans["messaging_delivery"]["Node Type"] in {"Index Scan", "Index Only Scan"}
    assert scans["messaging_delivery"]["Actual Loops"] <= len(sent_again)
    with connection.cursor() as cursor:
        cursor.execute(RECENT_TEXTS_SQL, [keys, "text", since])
        assert sorted(row[0] for row in cursor.fetchall()) == sorted(sha(text) for text in sent_again)


def test_the_migration_gives_the_last_day_s_messages_their_dedupe_key(pair) -> None:
    import importlib

    from django.apps import apps

    from messaging.services.pair import dedupe_key

    migration = importlib.import_module("messaging.migrations.0005_dedupe_key")
    alice, _bob = pair
    recent = message_send(SendRequest(sender=alice, to="bob", text="recent")).message
    old = message_send(SendRequest(sender=alice, to="bob", text="old")).message
    Message.objects.update(dedupe_key="")
    Message.objects.filter(pk=old.id).update(created_at=timezone.now() - timedelta(days=2))

    migration.keys_for_recent_messages(apps, None)

    keys = dict(Message.objects.values_list("id", "dedupe_key"))
    assert keys == {recent.id: dedupe_key(alice.id, recent.sha256), old.id: ""}


def test_the_pair_key_is_the_migrations_formula_and_is_written_with_every_message(pair) -> None:
    import importlib

    from messaging.services.notifications import Notice, notifications_send
    from messaging.services.pair import pair_key
    from messaging.services.pipeline import messages_send_batch

    migration = importlib.import_module("messaging.migrations.0006_pair_key")
    alice, bob = pair
    assert pair_key(alice.id, bob.id) == migration.pair_key(alice.id, bob.id)
    assert pair_key(alice.id, bob.id) != pair_key(bob.id, alice.id)

    message_send(SendRequest(sender=alice, to="bob", text="one"))
    messages_send_batch(sender=bob, items=[{"to": "alice", "text": "two"}])
    notifications_send([Notice(recipient_id=bob.id, text="from the hub")])
    keys = dict(Message.objects.values_list("text", "pair_key"))
    assert keys == {
        "one": pair_key(alice.id, bob.id),
        "two": pair_key(bob.id, alice.id),
        "from the hub": None,
    }


def test_the_migration_gives_the_last_day_s_messages_their_pair_key(pair) -> None:
    import importlib

    from django.apps import apps

    from messaging.services.pair import pair_key

    migration = importlib.import_module("messaging.migrations.0006_pair_key")
    alice, bob = pair
    recent = message_send(SendRequest(sender=alice, to="bob", text="recent")).message
    reply = message_send(SendRequest(sender=bob, to="alice", text="reply")).message
    old = message_send(SendRequest(sender=alice, to="bob", text="old")).message
    Message.objects.update(pair_key=None)
    Message.objects.filter(pk=old.id).update(created_at=timezone.now() - timedelta(days=2))

    migration.keys_for_recent_messages(apps, None)

    keys = dict(Message.objects.values_list("id", "pair_key"))
    assert keys == {recent.id: pair_key(alice.id, bob.id), reply.id: pair_key(bob.id, alice.id), old.id: None}


def _rows_read(sql: str, params: list, **how: Any) -> int:
    """The most rows any node of `sql`'s plan produced, or read and dropped (EXPLAIN ANALYZE; `how`:
    as `_plan_nodes` takes it)."""
    return max(
        node.get("Actual Rows", 0) * node.get("Actual Loops", 1) + node.get("Rows Removed by Filter", 0)
        for node in plan_nodes(sql, params, **how)
    )


def test_a_pair_s_loop_counts_read_that_pair_s_texts_only(pair) -> None:
    """Counting a pair's recent texts must not read the other traffic of either side: not the
    recipient's texts to others, nor the sender's inbox. Joined through the deliveries, the count
    read one of them (510 rows here)."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL planner question")
    alice, bob = pair
    carol = session_register(name="carol").session
    for i in range(150):  # bob is busy with carol, and carol writes to both a lot
        message_send(SendRequest(sender=bob, to="carol", text=f"to carol {i}", origin=HUB_MADE))
        message_send(SendRequest(sender=carol, to="alice", text=f"to alice {i}", origin=HUB_MADE))
        message_send(SendRequest(sender=carol, to="bob", text=f"to bob {i}", origin=HUB_MADE))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    facts, read = _pair_read(sender=alice, recipient=bob, sha256=sha("hello"), now=timezone.now())
    assert (facts.loop_replies, facts.loop_sends) == (0, 0)
    assert _rows_read(*read) < 10


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_pair_read_reads_only_the_pair_under_any_plan(pair, mode: str) -> None:
    """The pair read is prepared, so PostgreSQL may run it with a generic plan made without its
    values, or plan it for them. Either must read only the pair's rows, on a hub where another
    pair fills the loop window and this pair has a long history from before it. Asked as
    `pair_key = … AND created_at >= …` under a LIMIT, the generic plan counted through the
    `created_at` index over the window, and the plan made for the values scanned the table."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL planner question")
    from messaging.services.pair import _statement

    alice, bob = pair
    carol, dave = (session_register(name=n).session for n in ("carol", "dave"))
    for i in range(300):
        message_send(SendRequest(sender=alice, to="bob", text=f"yesterday {i}", origin=HUB_MADE))
        message_send(SendRequest(sender=bob, to="alice", text=f"yesterday back {i}", origin=HUB_MADE))
    Message.objects.update(created_at=timezone.now() - timedelta(days=1))
    for i in range(600):  # another pair fills the window
        message_send(SendRequest(sender=carol, to="dave", text=f"busy {i}", origin=HUB_MADE))
    for i in range(3):
        message_send(SendRequest(sender=alice, to="bob", text=f"today {i}", origin=HUB_MADE))
        message_send(SendRequest(sender=bob, to="alice", text=f"today back {i}", origin=HUB_MADE))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    # The replies reach the threshold, so the sender's own direction is counted too.
    with override_settings(SWITCHBOARD_LOOP_EXCHANGES=3):
        facts, (sql, params) = _pair_read(
            sender=alice, recipient=bob, sha256=sha("today 0"), now=timezone.now()
        )
    assert (facts.loop_replies, facts.loop_sends) == (3, 3) and facts.duplicate_of is not None
    assert sql == _statement()
    assert _rows_read(sql, params, mode=mode) < 10


def test_the_pair_read_is_prepared_like_the_rest_of_a_send(pair) -> None:
    """Planning the pair read on every call cost PostgreSQL 0.2–0.5 ms per send; it is prepared
    once a connection has run it `prepare_threshold` times (settings), as every other statement."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL question")
    from messaging.services.pair import _statement

    alice, bob = pair
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is not None  # the hub prepares its statements
    for i in range(connection.connection.prepare_threshold + 3):
        pair_facts(sender=alice, recipient=bob, sha256=sha("x"), now=timezone.now())
        message_send(SendRequest(sender=alice, to="bob", text=f"prepared {i}", origin=HUB_MADE))
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    numbered = iter(range(1, _statement().count("%s") + 1))
    assert re.sub("%s", lambda _: f"${next(numbered)}", _statement()) in prepared
