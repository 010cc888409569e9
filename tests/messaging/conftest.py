"""Hubs whose PostgreSQL planner statistics mislead, for the tests that check a statement's plan
keeps its shape under them (`tests/messaging/plans.py` reads the plans).

ANALYZE writes a table's row count in place, so a test's rollback keeps what it wrote: each
fixture that runs ANALYZE runs it again at teardown, with the test's own rows in the tables, so
that later tests do not inherit misleading statistics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from messaging.models import AgentSession, Delivery, Message
from messaging.services.pipeline import message_send
from messaging.services.request import HUB_MADE, SendRequest
from messaging.services.sessions import session_register

Pair = tuple[AgentSession, AgentSession]


@pytest.fixture
def pair() -> Pair:
    """alice (sender) and bob (recipient), live."""
    return session_register(name="alice").session, session_register(name="bob").session


def _analyze(tables: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {tables}")


@pytest.fixture
def busy_new_sender(pair: Pair) -> Iterator[Pair]:
    """alice and bob, after the hub's traffic so far (500 messages between two others) was
    analyzed and alice then sent bob 300 texts ("busy 0" ... "busy 299"): PostgreSQL's statistics
    take her for a rare sender and bob for a rare recipient."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL planner question")
    alice, bob = pair
    carol = session_register(name="carol").session
    session_register(name="dave")
    for i in range(500):  # the hub's traffic so far, which the statistics describe
        message_send(SendRequest(sender=carol, to="dave", text=f"earlier {i}", origin=HUB_MADE))
    _analyze()  # before alice writes anything: neither she nor bob is in the statistics
    _busy_texts_sent(alice)
    yield alice, bob
    _analyze()


def _busy_texts_sent(alice: AgentSession) -> None:
    """alice sends bob the 300 texts "busy 0" ... "busy 299" (hub-made: no rate limits), which the
    dedupe lookup tests send again."""
    for i in range(300):
        message_send(SendRequest(sender=alice, to="bob", text=f"busy {i}", origin=HUB_MADE))


class _Undone(Exception):
    pass


@pytest.fixture
def sender_after_empty_statistics(pair: Pair) -> Iterator[Pair]:
    """alice and bob, after PostgreSQL analyzed the message and delivery tables while they held a
    page of rows but none live (rows written and rolled back), then alice sent bob 300 texts
    ("busy 0" ... "busy 299"): the statistics take the tables for empty until the next ANALYZE."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL planner question")
    alice, bob = pair
    tables = f"{Message._meta.db_table}, {Delivery._meta.db_table}"
    with pytest.raises(_Undone), transaction.atomic():  # a page written, its rows never committed
        message_send(SendRequest(sender=alice, to="bob", text="undone", origin=HUB_MADE))
        raise _Undone
    _analyze(tables)
    _busy_texts_sent(alice)
    yield alice, bob
    _analyze(tables)
