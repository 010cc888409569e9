"""The batch's dedupe lookup probes the sender's messages text by text: its cost does not grow with
how much the sender wrote within the window (PostgreSQL)."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from messaging.models import MessageKind
from messaging.services.pair import dedupe_key
from messaging.services.pipeline import RECENT_TEXTS_SQL, messages_send_batch
from messaging.services.sessions import session_register
from tests.messaging.plans import rows_read

# What the lookup was before: one probe per text on paper, but planned as a read of every message
# the sender wrote within the window once the statistics lag behind the sender.
FLAT_LOOKUP_SQL = (
    "SELECT m.sha256, d.recipient_id, d.id FROM messaging_delivery d JOIN messaging_message m "
    "ON m.id = d.message_id WHERE m.sha256 = ANY(%s) AND m.sender_id = %s AND m.kind = %s "
    "AND m.created_at >= %s ORDER BY m.created_at"
)


def _rows_touched(plan: dict, table: str) -> int:
    """Rows the plan's scans of `table` returned or filtered out, over all their loops."""
    own = rows_read(plan) if plan.get("Relation Name") == table else 0
    return own + sum(_rows_touched(child, table) for child in plan.get("Plans", []))


def _send(sender_name: str, prefix: str, batches: int) -> None:
    from messaging.models import AgentSession

    sender = AgentSession.objects.get(name=sender_name)
    for k in range(batches):
        items = [{"to": "sink", "text": f"{prefix} {k}-{j}"} for j in range(100)]
        assert not [o for o in messages_send_batch(sender=sender, items=items) if isinstance(o, Exception)]


def _lookup(sql: str, sender_id: object, texts: list[str], window: int) -> tuple[int, list[str]]:
    asked = sorted(hashlib.sha256(t.encode()).hexdigest() for t in texts)
    since = timezone.now() - timedelta(seconds=window)
    if sql == RECENT_TEXTS_SQL:  # asks by the texts' dedupe keys, which hold the sender
        params = [[dedupe_key(sender_id, sha256) for sha256 in asked], MessageKind.TEXT, since]
    else:
        params = [asked, sender_id, MessageKind.TEXT, since]
    with connection.cursor() as cursor:
        cursor.cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params, prepare=False)
        (explained,) = cursor.fetchone()
        cursor.cursor.execute(sql, params, prepare=False)
        found = [row[0] for row in cursor.fetchall()]
    plan = (explained if isinstance(explained, list) else json.loads(explained))[0]["Plan"]
    return _rows_touched(plan, "messaging_message"), found


@pytest.mark.django_db
def test_the_lookup_reads_only_the_texts_asked_for_however_much_the_sender_wrote(settings) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    settings.SWITCHBOARD_RATE_PAIR = settings.SWITCHBOARD_RATE_HUB = 10**7
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 10**7
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 10**7
    sender = session_register(name="chatty").session
    session_register(name="sink")
    _send("chatty", "earlier", 20)
    with connection.cursor() as cursor:  # what autovacuum does on a running hub...
        cursor.execute("ANALYZE messaging_message; ANALYZE messaging_delivery")
    _send("chatty", "later", 30)  # ...and then the sender writes on: 5,000 within the window
    texts = [f"new {j}" for j in range(99)] + ["later 7-7"]  # one of them was sent
    window = settings.SWITCHBOARD_DEDUPE_SECONDS

    touched, found = _lookup(RECENT_TEXTS_SQL, sender.id, texts, window)
    touched_before, found_before = _lookup(FLAT_LOOKUP_SQL, sender.id, texts, window)

    assert found == found_before == [hashlib.sha256(b"later 7-7").hexdigest()]
    assert touched <= 10, touched  # one probe per text
    assert touched_before >= 2000, touched_before  # the plan this replaced read the window
