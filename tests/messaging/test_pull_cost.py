"""What a pull costs: the number of queries does not grow with the number of messages handed over."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from messaging.framing import frames_for_recipient
from messaging.principals import session_principal
from messaging.services import events
from messaging.services.delivery import inbox_pull
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.sessions import session_register

pytestmark = pytest.mark.django_db


def pull_queries(count: int) -> list[str]:
    alice, bob = session_register(name=f"alice{count}").session, session_register(name=f"bob{count}").session
    for i in range(count):
        message_send(SendRequest(sender=alice, to=bob.ref, text=f"message {i}"))
    with CaptureQueriesContext(connection) as queries:
        frames = frames_for_recipient(inbox_pull(recipient=bob, actor=session_principal(bob)))
    assert len(frames) == count
    return [q["sql"] for q in queries.captured_queries]


def test_a_pull_of_many_messages_costs_as_many_queries_as_a_pull_of_one(settings) -> None:
    settings.SWITCHBOARD_RATE_PAIR = 1000
    assert len(pull_queries(25)) == len(pull_queries(1))


def test_a_pull_reads_the_deliveries_once() -> None:
    reads = [sql for sql in pull_queries(3) if sql.startswith("SELECT") and '"messaging_delivery"' in sql]
    assert len(reads) == 1, reads  # locked and read whole, then moved: no second read


def test_a_bundle_of_events_that_cannot_be_pushed_is_logged_not_raised(caplog) -> None:
    import asyncio

    class Failing:
        async def group_send(self, group, message):
            raise ConnectionError("redis went away")

    bundle = {"type": "hub.events", "events": [{"type": "hub.event", "kind": "x", "data": {}}]}
    asyncio.run(events._publish(Failing(), [(["operators"], bundle)]))
    assert "could not push hub.events to operators" in caplog.text
