"""The embedded SQLite backend (`hub.sqlite`): a process's write transactions queue on a lock
per database file, taken at BEGIN and given back at commit, rollback or close, so a writer starts
as soon as the one before it is done instead of sleeping in SQLite's busy handler."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from hub.sqlite.base import write_lock
from messaging.models import OperatorToken

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the write lock is part of the SQLite backend")


def lock() -> threading.Lock:
    return write_lock(str(connection.settings_dict["NAME"]))


def in_thread(work) -> threading.Thread:
    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()  # this thread's connection

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_write_transaction_holds_the_lock_until_it_commits_and_the_next_writer_waits_for_it() -> None:
    first_inside, first_may_commit, second_inside = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            OperatorToken.objects.create(name="first", token_hash="a" * 64)
            first_inside.set()
            first_may_commit.wait(5)

    def second() -> None:
        with transaction.atomic():
            second_inside.set()
            OperatorToken.objects.create(name="second", token_hash="b" * 64)

    a = in_thread(first)
    assert first_inside.wait(5)
    assert lock().locked()  # taken at BEGIN
    b = in_thread(second)
    assert not second_inside.wait(0.3)  # queued behind the first writer
    first_may_commit.set()
    a.join(5), b.join(5)
    assert second_inside.is_set()
    assert not lock().locked()  # both committed: given back
    assert sorted(OperatorToken.objects.values_list("name", flat=True)) == ["first", "second"]


def test_a_rolled_back_or_failed_transaction_gives_the_lock_back() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        OperatorToken.objects.create(name="gone", token_hash="c" * 64)
        assert lock().locked()
        raise RuntimeError("rolled back")
    assert not lock().locked()
    assert not OperatorToken.objects.filter(name="gone").exists()


def test_a_writer_that_waits_longer_than_the_timeout_goes_ahead_without_the_lock() -> None:
    """The lock only orders this process's writers; past the connection's timeout SQLite decides."""
    held = lock()
    held.acquire()
    options = connection.settings_dict.setdefault("OPTIONS", {})
    before = options.get("timeout")
    options["timeout"] = 0.1
    try:
        with transaction.atomic():
            OperatorToken.objects.create(name="late", token_hash="d" * 64)
        assert OperatorToken.objects.filter(name="late").exists()
    finally:
        if before is None:
            options.pop("timeout")
        else:
            options["timeout"] = before
        held.release()
