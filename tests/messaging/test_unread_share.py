"""One sender's share of a recipient's unread cap (SWITCHBOARD_UNREAD_PER_SENDER): a sender holding
one session token fills at most its share of a recipient's inbox, so every other sender still gets
through (docs/security.md). Run on SQLite by the fast suite and on PostgreSQL by the PG stage."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from messaging.errors import SwitchboardError
from messaging.models import AgentSession
from messaging.principals import session_principal
from messaging.services.pair import pair_facts
from messaging.services.pipeline import message_send, messages_send, messages_send_batch
from messaging.services.request import HUB_MADE, SendRequest
from messaging.services.sessions import session_register
from tests.messaging.plans import plan_nodes, rows_read, the_one_statement


@pytest.fixture(autouse=True)
def _own_limit_keys(settings):
    """Each test gets its own rate-limit key space, so the buckets start full."""
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-limits-{uuid.uuid4().hex}"


def label(outcome: object) -> str:
    if isinstance(outcome, SwitchboardError):
        return f"{outcome.code}:{outcome.extra.get('reason', '')}" if outcome.extra else outcome.code
    return outcome.status  # type: ignore[attr-defined]


def test_one_sender_fills_only_its_share_and_everyone_else_still_gets_through(api, register, send, settings):
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 6
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 3
    mallory, alice, carol, bob = register("mallory"), register("alice"), register("carol"), register("bob")
    # When Mallory floods Bob with one token,
    for i in range(3):
        assert send(mallory, "bob", f"flood {i}").status_code == 201
    r = send(mallory, "bob", "flood 3")
    # then she is refused once her share is full, with a sentence that says why,
    assert r.status_code == 429, r.json_body
    assert (r.json_body["error"], r.json_body["reason"]) == ("rate_limited", "unread_share_full")
    assert "not read 3 of your messages" in r.json_body["detail"]
    assert "at most 3" in r.json_body["detail"] and r.json_body["retry_after"] > 0
    # and Alice still reaches Bob, up to the recipient's cap, which stays as it is.
    for i in range(3):
        assert send(alice, "bob", f"review {i}").status_code == 201
    r = send(carol, "bob", "one more")
    assert r.status_code == 429 and r.json_body["reason"] == "recipient_queue_full"
    # Once Bob reads one of Mallory's messages, she may send one more (pulled alone is still unread).
    pulled = api.get("inbox", bob.token).json_body["messages"]
    from_mallory = [m["id"] for m in pulled if m["from"]["ref"] == mallory.ref]
    assert send(mallory, "bob", "still waiting").status_code == 429
    api.post("inbox/ack", bob.token, {"ids": from_mallory[:1]})
    assert send(mallory, "bob", "now it fits").status_code == 201
    r = send(alice, "bob", "full again")
    assert r.status_code == 429 and r.json_body["reason"] == "recipient_queue_full"


def test_a_full_inbox_does_not_tell_a_sender_how_many_unread_messages_the_recipient_has(
    register, send, settings
):
    """Given bob with 7 unread messages (hub-made ones pass the cap) against a cap of 3, when
    mallory sends him one, then she is told his inbox is full, never how many he has unread: that
    count is bob's activity, not hers to learn."""
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 3
    mallory, bob, _ = register("mallory"), register("bob"), register("carol")
    carol = AgentSession.objects.get(name="carol")
    for i in range(7):
        message_send(SendRequest(sender=carol, to="bob", text=f"from the hub {i}", origin=HUB_MADE))
    r = send(mallory, "bob", "hello")
    assert r.status_code == 429 and r.json_body["reason"] == "recipient_queue_full", r.json_body
    detail = r.json_body["detail"].replace(bob.ref, "")  # a ref may hold any digit
    assert "7" not in detail, detail
    assert "full" in detail and "3" in detail
    assert set(r.json_body) == {"error", "detail", "reason", "retry_after"}


def test_the_attack_at_the_default_limits(api, register, send, settings):
    """One token, the defaults (50 unread per recipient, half of it per sender), the pair rate
    out of the way: the sender fills half of the inbox, another sender fills the rest."""
    settings.SWITCHBOARD_RATE_PAIR = 1000
    assert (settings.SWITCHBOARD_UNREAD_PER_RECIPIENT, settings.SWITCHBOARD_UNREAD_PER_SENDER) == (50, 25)
    mallory, alice, carol = register("mallory"), register("alice"), register("carol")
    register("bob")
    flood = [send(mallory, "bob", f"flood {i}") for i in range(50)]
    assert [r.status_code for r in flood] == [201] * 25 + [429] * 25
    assert {r.json_body["reason"] for r in flood[25:]} == {"unread_share_full"}
    assert all(send(alice, "bob", f"hello {i}").status_code == 201 for i in range(25))
    assert send(carol, "bob", "and me").json_body["reason"] == "recipient_queue_full"


def test_a_batch_counts_the_senders_share_along(register, settings):
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 10
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 3
    register("mallory"), register("bob"), register("carol")
    mallory = AgentSession.objects.get(name="mallory")
    message_send(SendRequest(sender=mallory, to="bob", text="already waiting"))
    # A batch sees the unread message from before and counts its own queued ones along, per recipient.
    items = [{"to": to, "text": f"{to} {i}"} for i in range(4) for to in ("bob", "carol")]
    outcomes = messages_send_batch(sender=mallory, items=items)
    assert [label(o) for o in outcomes] == [
        *("queued", "queued"),
        *("queued", "queued"),
        *("rate_limited:unread_share_full", "queued"),
        *("rate_limited:unread_share_full", "rate_limited:unread_share_full"),
    ]


def test_a_group_of_senders_gets_the_one_by_one_outcomes(register, settings):
    """The hub's group commit (`messages_send`): each sender's share is counted apart, the recipient's
    cap across them, as the requests would have been sent one by one."""
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 5
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 2
    for name in ("mallory", "alice", "bob"):
        register(name)
    sessions = {s.name: s for s in AgentSession.objects.all()}
    order = ["mallory", "mallory", "alice", "mallory", "alice", "alice", "mallory"]
    group = [
        SendRequest(sender=sessions[n], actor=session_principal(sessions[n]), to="bob", text=f"{n} {i}")
        for i, n in enumerate(order)
    ]
    outcomes = messages_send(group)
    assert [label(o) for o in outcomes] == [
        "queued",
        "queued",
        "queued",
        "rate_limited:unread_share_full",
        "queued",
        "rate_limited:unread_share_full",
        "rate_limited:unread_share_full",
    ]


def test_hub_made_messages_count_but_are_never_refused(register, settings):
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 10
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 2
    register("mallory"), register("bob")
    mallory = AgentSession.objects.get(name="mallory")
    for i in range(3):  # the hub writing on Mallory's behalf (a fired subscription, a team frame)
        assert message_send(SendRequest(sender=mallory, to="bob", text=f"notice {i}", origin=HUB_MADE))
    with pytest.raises(SwitchboardError) as refused:
        message_send(SendRequest(sender=mallory, to="bob", text="her own"))
    assert refused.value.extra["reason"] == "unread_share_full"


def test_the_pair_read_gives_the_senders_share(register):
    register("alice"), register("bob"), register("carol")
    alice, bob, carol = (AgentSession.objects.get(name=n) for n in ("alice", "bob", "carol"))
    for i in range(2):
        message_send(SendRequest(sender=alice, to="bob", text=f"a {i}"))
    message_send(SendRequest(sender=carol, to="bob", text="c"))
    message_send(SendRequest(sender=bob, to="alice", text="back"))
    now = timezone.now()
    sha = hashlib.sha256(b"x").hexdigest()
    facts = pair_facts(sender=alice, recipient=bob, sha256=sha, now=now)
    assert (facts.unread, facts.unread_own) == (3, 2)
    facts = pair_facts(sender=carol, recipient=bob, sha256=sha, now=now)
    assert (facts.unread, facts.unread_own) == (3, 1)
    facts = pair_facts(sender=carol, recipient=alice, sha256=sha, now=now)
    assert (facts.unread, facts.unread_own) == (1, 0)


def _settings_loaded(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_UNREAD_")}
    environment.update(env, DJANGO_SETTINGS_MODULE="hub.settings")
    code = (
        "from django.conf import settings; "
        "print(settings.SWITCHBOARD_UNREAD_PER_RECIPIENT, settings.SWITCHBOARD_UNREAD_PER_SENDER)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_share_defaults_to_half_the_cap_and_never_exceeds_it(tmp_path):
    home = str(tmp_path)
    assert _settings_loaded(SWITCHBOARD_HOME=home).stdout.split() == ["50", "25"]
    assert _settings_loaded(SWITCHBOARD_HOME=home, SWITCHBOARD_UNREAD_PER_RECIPIENT="7").stdout.split() == [
        "7",
        "4",
    ]
    too_big = _settings_loaded(
        SWITCHBOARD_HOME=home, SWITCHBOARD_UNREAD_PER_RECIPIENT="10", SWITCHBOARD_UNREAD_PER_SENDER="11"
    )
    assert too_big.returncode != 0 and "SWITCHBOARD_UNREAD_PER_SENDER (11) is at most" in too_big.stderr


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.django_db
def test_the_share_is_read_from_the_pair_s_few_count_rows(mode: str) -> None:
    """The share is one more scalar of the pair read (a lone send's and a batch's): it reads the
    pair's count rows (one per stripe) by the count table's key, on a hub where 40 sessions write
    to each other and to the recipient and the sender writes to all of them, under either kind of
    plan the prepared read may run with."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL planner question")
    from messaging.models import Delivery, Message
    from messaging.services.pipeline import pair_facts_read

    alice, bob = (session_register(name=n).session for n in ("alice", "bob"))
    others = [session_register(name=f"other{i}").session for i in range(40)]
    pairs = [(s, r) for s in [alice, *others] for r in [bob, *others] if s != r]
    messages = Message.objects.bulk_create(
        Message(sender=s, text=f"{s.name} to {r.name}", size=1, sha256="0" * 64) for s, r in pairs
    )
    Delivery.objects.bulk_create(
        Delivery(message=m, recipient=r, state="queued") for m, (_s, r) in zip(messages, pairs, strict=True)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    sha = hashlib.sha256(b"x").hexdigest()
    now = timezone.now()

    facts, single = the_one_statement(lambda: pair_facts(sender=alice, recipient=bob, sha256=sha, now=now))
    read, batch = the_one_statement(lambda: pair_facts_read([(alice.id, bob.id)], now=now))

    assert (facts.unread, facts.unread_own) == (41, 1) and read[(alice.id, bob.id)][4:6] == (41, 1)
    for sql, params in (single, batch):
        nodes = plan_nodes(sql, params, mode=mode)
        shares = [n for n in nodes if n.get("Relation Name") == "messaging_unreadshare"]
        assert shares and all(n["Node Type"] in {"Index Scan", "Index Only Scan"} for n in shares), shares
        assert sum(rows_read(n) for n in shares) <= 8
