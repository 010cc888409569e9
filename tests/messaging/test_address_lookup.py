"""The lookup of the sessions an address could mean (`_candidate_rows`): what it finds, and that it
reads only live sessions through their indexes, however many exited ones a hub keeps.

Run on SQLite by the fast suite and on PostgreSQL by the PG stage."""

from __future__ import annotations

import re
import sys

import pytest
from django.db import connection
from django.db.models import Q
from hypothesis import given
from hypothesis import strategies as st

from hub_fixtures.history import exited_sessions_made
from messaging.addressing import parse_address
from messaging.models import AgentSession, SessionStatus
from messaging.services.pipeline import message_send
from messaging.services.recipients import _candidate_rows, _candidate_statement, prefix_end
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register
from tests.messaging.plans import plan_nodes, the_one_statement

# Characters around the edges `prefix_end` steps over: the last before the surrogates, the first
# after them, the last code point, and some ordinary ones.
EDGES = ["a", "b", "z", "ß", "\u00ff", "\ud7ff", "\ue000", "\uffff", "\U00010000", chr(sys.maxunicode)]
TEXT = st.text(alphabet=st.sampled_from(EDGES) | st.characters(exclude_categories=["Cs"]), max_size=6)


@given(prefix=TEXT.filter(bool), rest=TEXT, other=TEXT)
def test_a_prefix_range_holds_exactly_the_strings_that_start_with_it(
    prefix: str, rest: str, other: str
) -> None:
    end = prefix_end(prefix)
    for s in (prefix + rest, other, prefix[:-1] + other, prefix + chr(sys.maxunicode) + rest):
        # Nothing starts with a run of U+10FFFF: names cannot hold it (its range is empty).
        expected = s.startswith(prefix) and bool(prefix.rstrip(chr(sys.maxunicode)))
        assert (prefix <= s < end) == expected, (prefix, s, end)


def _orm_candidates(target: str) -> set:
    """What an address may mean, said with the ORM: the reference `_candidate_rows` must agree with."""
    address = parse_address(target)
    query = Q(name_key__startswith=address.key) if len(address.key) >= 3 else Q(name_key=address.key)
    query |= Q(name=target)
    if address.uuid:
        query |= Q(pk=address.uuid)
    if address.ref:
        query |= Q(ref=address.ref)
    if address.name_ref:
        query |= Q(ref=address.name_ref[1])
    return set(
        AgentSession.objects.filter(query).exclude(status=SessionStatus.EXITED).values_list("id", flat=True)
    )


@pytest.mark.django_db
def test_the_lookup_finds_what_the_orm_query_finds() -> None:
    names = (
        "ab_cd",
        "abxcd",
        "a.b",
        "axb",
        "Bob",
        "bobby",
        "x",
        "Straße",
        "Ωmega-1",
        "日本語エージェント",
        "abd",
    )
    made = [session_register(name=n).session for n in names]
    exited = session_register(name="bob-old").session
    AgentSession.objects.filter(pk=exited.pk).update(status=SessionStatus.EXITED)
    addresses = [
        *("ab_", "abx", "abc", "a%", "bob", "Bob", "BOBB", "bo", "x", "bob-old"),
        *("strasse", "STRA", "ωme", "日本語", "日本"),
        made[0].ref,
        made[0].ref.upper(),
        str(made[1].id),
        f"bobby [{made[5].ref}]",
        f"nobody [{made[2].ref}]",
    ]
    for target in addresses:
        assert {s.id for s in _candidate_rows(parse_address(target))} == _orm_candidates(target), target
    assert {s.name for s in _candidate_rows(parse_address("ab_"))} == {"ab_cd"}  # `_` is not a wildcard
    assert {
        s.name for s in _candidate_rows(parse_address("abc"))
    } == set()  # abd is above the range, ab_cd below
    assert [s.name for s in _candidate_rows(parse_address("bob"))] == [
        "Bob",
        "bobby",
    ]  # in the order they registered


@pytest.fixture
def hub_with_history():
    """A hub that has seen 3,000 sessions come and go, 2,000 of them in the folder `app` (so named
    `app`), with three live sessions, and statistics that know all that."""
    exited_sessions_made(["app"] * 2000 + [f"app-{i}" for i in range(1000)])
    live = [session_register(name=n).session for n in ("app", "app-tests", "reviewer")]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return live


def _candidate_sql(target: str) -> tuple[str, list]:
    return the_one_statement(lambda: _candidate_rows(parse_address(target)))[1]


TARGETS = ["app", "app-te", "ap", "Reviewer"]


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_postgresql_reads_only_live_sessions_by_their_indexes(hub_with_history, mode: str) -> None:
    """Every name lookup reads the live sessions' indexes and no exited row, under either kind of
    plan its prepared statement may run with. (It read the whole table when one of its conditions,
    the exact name, had no index: every send cost more with every session the hub had seen.)"""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL planner question")
    by_ref = hub_with_history[2].ref
    with connection.cursor() as cursor:  # the id's and the ref's: each finds one row at most
        constraints = connection.introspection.get_constraints(cursor, AgentSession._meta.db_table)
    unique = {name for name, about in constraints.items() if about["unique"] and about["index"]}
    for target in [*TARGETS, by_ref, f"reviewer [{by_ref}]"]:
        sql, params = _candidate_sql(target)
        nodes = plan_nodes(sql, params, mode=mode)
        kinds = {node["Node Type"] for node in nodes}
        indexes = {node.get("Index Name") for node in nodes} - {None}
        assert "Seq Scan" not in kinds, (target, kinds)
        assert indexes and all(name.startswith("session_live_") or name in unique for name in indexes), (
            target,
            indexes,
        )
        read = max(node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) for node in nodes)
        assert read <= 3, (target, read)


@pytest.mark.django_db
def test_sqlite_reads_only_live_sessions_by_their_indexes(hub_with_history) -> None:
    """SQLite reads the table only through a live-session index (walking one of them whole reads
    the live sessions alone) or by a unique key (id, ref): never row by row."""
    if connection.vendor != "sqlite":
        pytest.skip("a SQLite planner question")
    table = AgentSession._meta.db_table
    app, _app_tests, reviewer = hub_with_history
    for target in [*TARGETS, reviewer.ref, f"reviewer [{reviewer.ref}]", str(app.id)]:
        sql, params = _candidate_sql(target)
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            steps = [row[-1] for row in cursor.fetchall()]
        reads = [step for step in steps if step.startswith((f"SCAN {table}", f"SEARCH {table}"))]
        assert reads, (target, steps)
        for step in reads:
            by_unique_key = step.startswith(f"SEARCH {table}") and re.search(r"\((id|ref)=\?\)", step)
            assert "INDEX session_live_" in step or by_unique_key, (target, steps)


@pytest.mark.django_db
def test_a_send_by_name_reaches_the_live_session_among_exited_ones(hub_with_history) -> None:
    app, app_tests, reviewer = hub_with_history
    outcome = message_send(SendRequest(sender=reviewer, to="app", text="the build is green"))
    assert outcome.recipient.id == app.id
    assert (
        message_send(SendRequest(sender=reviewer, to="APP-T", text="and the tests")).recipient.id
        == app_tests.id
    )


@pytest.mark.parametrize(
    "shape", [(p, i, r, n) for p in (0, 1) for i in (0, 1) for r in (0, 1) for n in (0, 1)]
)
def test_each_address_shape_asks_for_each_of_its_values(shape: tuple[int, int, int, int]) -> None:
    prefix, by_id, by_ref, by_name_ref = shape
    sql = _candidate_statement(connection.vendor, *map(bool, shape))
    # the key (a range: two), the name, then the id, the ref and the `name [ref]` ref when given
    assert sql.count("%s") == 2 + prefix + by_id + by_ref + by_name_ref
