"""An authenticated call notes when its session was seen; the time is written later, together
with the others (messaging.services.seen)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging import auth
from messaging.models import AgentSession
from messaging.services import seen
from messaging.services.seen import SeenTimes, seen_times_written
from messaging.services.sessions import session_register

pytestmark = pytest.mark.django_db


def _seen_ago(session_id: object, seconds: float) -> None:
    AgentSession.objects.filter(pk=session_id).update(last_seen=timezone.now() - timedelta(seconds=seconds))


def _last_seen(session_id: object) -> object:
    return AgentSession.objects.get(pk=session_id).last_seen


@pytest.fixture
def later(settings, monkeypatch) -> SeenTimes:
    """The hub as it runs (not the tests' inline jobs), with this process's SeenTimes not
    started: the test writes what is noted itself."""
    settings.SWITCHBOARD_JOBS = "thread"
    writer = SeenTimes()
    monkeypatch.setattr(seen, "_instance", writer)
    return writer


def test_an_authenticated_call_writes_nothing_and_notes_the_time(later: SeenTimes) -> None:
    made = session_register(name="alice")
    _seen_ago(made.session.id, 30)
    before = _last_seen(made.session.id)

    with CaptureQueriesContext(connection) as queries:
        caller = auth.principal_from_token(made.token)

    assert caller is not None and caller.session is not None and caller.session.id == made.session.id
    assert [
        q["sql"] for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith("SELECT")
    ] == []
    assert _last_seen(made.session.id) == before
    noted = later.noted()[made.session.id]
    assert noted > before

    assert later.write() == 1
    assert _last_seen(made.session.id) == noted
    assert later.noted() == {}


def test_a_session_seen_within_the_second_is_not_noted_again(later: SeenTimes) -> None:
    made = session_register(name="alice")  # registering sets last_seen to now
    auth.principal_from_token(made.token)
    assert later.noted() == {}


def test_many_sessions_go_in_one_write(later: SeenTimes) -> None:
    made = [session_register(name=f"agent-{i}") for i in range(5)]
    for m in made:
        _seen_ago(m.session.id, 30)
        auth.principal_from_token(m.token)
    assert set(later.noted()) == {m.session.id for m in made}

    with CaptureQueriesContext(connection) as queries:
        assert later.write() == 5
    updates = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"]]
    assert len(updates) == 1 and updates[0].startswith("5 times: ")  # one executemany
    assert all(_last_seen(m.session.id) > timezone.now() - timedelta(seconds=5) for m in made)


def test_a_written_time_never_moves_back() -> None:
    newer = session_register(name="newer").session
    older = session_register(name="older").session
    moment = timezone.now()
    AgentSession.objects.filter(pk=newer.id).update(last_seen=moment + timedelta(seconds=5))
    AgentSession.objects.filter(pk=older.id).update(last_seen=moment - timedelta(seconds=5))

    seen_times_written({newer.id: moment, older.id: moment})

    assert _last_seen(newer.id) == moment + timedelta(seconds=5)
    assert _last_seen(older.id) == moment


def test_a_failed_write_keeps_the_times_for_the_next(later: SeenTimes, monkeypatch, caplog) -> None:
    made = session_register(name="alice")
    _seen_ago(made.session.id, 30)
    auth.principal_from_token(made.token)
    noted = later.noted()[made.session.id]
    real = seen.seen_times_written

    def database_away(times: dict) -> None:
        raise OperationalError("the database is away")

    monkeypatch.setattr(seen, "seen_times_written", database_away)
    assert later.write() == 0
    assert later.write() == 0
    assert later.noted() == {made.session.id: noted}
    assert len([r for r in caplog.records if "could not write when" in r.getMessage()]) == 1  # once per run

    monkeypatch.setattr(seen, "seen_times_written", real)
    assert later.write() == 1
    assert _last_seen(made.session.id) == noted


def test_in_the_tests_inline_jobs_the_call_writes_at_once() -> None:
    made = session_register(name="alice")
    _seen_ago(made.session.id, 30)
    before = _last_seen(made.session.id)
    auth.principal_from_token(made.token)
    assert _last_seen(made.session.id) > before


def _written_by_a_thread(settings) -> None:
    """Start a SeenTimes thread, note a time for a session last seen 30 s ago, and wait up to
    10 s for the thread to write it. On PostgreSQL only: the thread has its own connection, and
    the tests' SQLite database is in memory, one thread's alone."""
    if connection.vendor != "postgresql":
        pytest.skip("the writer's thread needs a database other connections see")
    settings.SWITCHBOARD_JOBS = "thread"
    made = session_register(name="alice")
    _seen_ago(made.session.id, 30)
    before = _last_seen(made.session.id)
    writer = SeenTimes().start()
    writer.note(made.session.id, timezone.now())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _last_seen(made.session.id) == before:
        time.sleep(0.05)
    assert _last_seen(made.session.id) > before
    assert writer.noted() == {}


@pytest.mark.django_db(transaction=True)
def test_the_thread_writes_what_was_noted_within_about_a_second(settings) -> None:
    _written_by_a_thread(settings)


@pytest.mark.django_db(transaction=True)
def test_the_thread_goes_on_when_its_connection_fails(settings, monkeypatch) -> None:
    calls = []
    real = seen.close_old_connections

    def failing_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("the connection broke while being closed")
        real()

    monkeypatch.setattr(seen, "close_old_connections", failing_once)
    _written_by_a_thread(settings)
    assert len(calls) >= 3  # the failed round, then one that opened and closed again
