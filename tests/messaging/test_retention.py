"""Retention: what the periodic purge deletes, what it never deletes, and deleting a session's data
on request. Real database rows through the services (SQLite and PostgreSQL runs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging.errors import Forbidden, NotFound
from messaging.models import AgentSession, AuditEvent, Delivery, Message, Pin, SessionStatus
from messaging.principals import operator_principal, session_principal
from messaging.services.pipeline import message_send
from messaging.services.request import SendRequest
from messaging.services.retention import (
    messages_purged,
    retention_purge,
    session_data_delete,
)
from messaging.services.sessions import session_register
from messaging.states import DeliveryState as S

pytestmark = pytest.mark.django_db
OPERATOR = operator_principal("ops")


@pytest.fixture
def alice_bob() -> tuple[AgentSession, AgentSession]:
    return session_register(name="alice").session, session_register(name="bob").session


def _sent(sender: AgentSession, to: str, text: str, *, state: str, days_ago: float) -> Message:
    """A message from `sender` to `to`, its delivery moved to `state`, dated `days_ago`."""
    outcome = message_send(SendRequest(sender=sender, to=to, text=text))
    at = timezone.now() - timedelta(days=days_ago)
    Message.objects.filter(pk=outcome.message.pk).update(created_at=at)
    Delivery.objects.filter(pk=outcome.delivery.pk).update(state=state)
    return outcome.message


def test_old_messages_whose_deliveries_are_all_final_are_purged_with_them(alice_bob, settings) -> None:
    # Given messages past retention in each final state, and one within it
    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 30
    alice, _ = alice_bob
    old = [
        _sent(alice, "bob", f"old {s}", state=s, days_ago=31)
        for s in ("read", "refused", "denied", "expired", "failed")
    ]
    recent = _sent(alice, "bob", "recent", state=S.READ, days_ago=29)

    # When retention runs
    purged = retention_purge()

    # Then the old ones are gone with their deliveries, the recent one stays
    assert purged.messages == 5 and purged.deliveries == 5
    assert not Message.objects.filter(pk__in=[m.pk for m in old]).exists()
    assert not Delivery.objects.filter(message_id__in=[m.pk for m in old]).exists()
    assert Message.objects.filter(pk=recent.pk).exists()


@pytest.mark.parametrize("state", [S.HELD, S.QUEUED, S.DELIVERED, S.RELAYED, S.ACCEPTED])
def test_held_and_unread_messages_are_never_purged_by_age(alice_bob, settings, state) -> None:
    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 1
    alice, _ = alice_bob
    kept = _sent(alice, "bob", f"still waiting ({state})", state=state, days_ago=400)
    assert retention_purge().messages == 0
    assert Message.objects.filter(pk=kept.pk).exists()


def test_a_purge_is_audited_as_counts_never_texts(alice_bob, settings) -> None:
    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 30
    alice, _ = alice_bob
    _sent(alice, "bob", "a text the audit never keeps", state=S.READ, days_ago=40)
    retention_purge()
    event = AuditEvent.objects.get(kind="retention.purged")
    assert event.detail == {"messages": 1, "deliveries": 1, "sessions": 0}
    assert "a text the audit never keeps" not in str(event.__dict__)


def test_zero_days_keeps_messages_forever(alice_bob, settings) -> None:
    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 0
    alice, _ = alice_bob
    _sent(alice, "bob", "ancient", state=S.READ, days_ago=4000)
    assert retention_purge().messages == 0


def test_purges_go_in_bounded_batches_and_the_next_run_goes_on(alice_bob, settings, monkeypatch) -> None:
    import messaging.services.retention as retention

    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 30
    monkeypatch.setattr(retention, "PURGE_BATCH", 2)
    monkeypatch.setattr(retention, "PURGE_BATCHES", 2)
    alice, _ = alice_bob
    for i in range(5):
        _sent(alice, "bob", f"old {i}", state=S.READ, days_ago=40)
    assert retention_purge().messages == 4
    assert retention_purge().messages == 1


def test_apps_above_hear_which_messages_were_purged(
    alice_bob, settings, django_capture_on_commit_callbacks
) -> None:
    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 30
    alice, _ = alice_bob
    old = _sent(alice, "bob", "old", state=S.READ, days_ago=40)
    heard: list[object] = []

    def listener(*, message_ids, **_):
        heard.extend(message_ids)

    messages_purged.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            retention_purge()
    finally:
        messages_purged.disconnect(listener)
    assert heard == [old.pk]


def test_exited_sessions_go_once_nothing_refers_to_them(settings) -> None:
    settings.SWITCHBOARD_SESSION_RETENTION_DAYS = 30
    long_gone = session_register(name="long-gone").session
    recently_gone = session_register(name="recently-gone").session
    live = session_register(name="live").session
    addressed = session_register(name="addressed").session
    message_send(SendRequest(sender=live, to="addressed", text="for you"))
    old = timezone.now() - timedelta(days=31)
    AgentSession.objects.filter(pk__in=[long_gone.pk, addressed.pk]).update(
        status=SessionStatus.EXITED, last_seen=old
    )
    AgentSession.objects.filter(pk=recently_gone.pk).update(
        status=SessionStatus.EXITED, last_seen=timezone.now()
    )
    AgentSession.objects.filter(pk=live.pk).update(last_seen=old)

    assert retention_purge().sessions == 1
    assert not AgentSession.objects.filter(pk=long_gone.pk).exists()
    assert AgentSession.objects.filter(pk__in=[recently_gone.pk, live.pk, addressed.pk]).count() == 3


def test_an_operator_deletes_one_sessions_messages_and_pins_and_it_is_audited(alice_bob) -> None:
    # Given alice wrote to bob and carol, bob wrote to alice, and carol to bob
    alice, bob = alice_bob
    carol = session_register(name="carol").session
    to_bob = message_send(SendRequest(sender=alice, to="bob", text="a")).message
    to_carol = message_send(SendRequest(sender=alice, to="carol", text="b")).message
    from_bob = message_send(SendRequest(sender=bob, to="alice", text="c")).message
    unrelated = message_send(SendRequest(sender=carol, to="bob", text="d")).message
    assert Pin.objects.filter(sender=alice).exists()

    # When an operator deletes alice's data
    counts = session_data_delete(session_id=alice.pk, actor=OPERATOR)

    # Then every message she sent or received is gone, her pins either way too; carol's to bob stays
    assert not Message.objects.filter(pk__in=[to_bob.pk, to_carol.pk, from_bob.pk]).exists()
    assert Message.objects.filter(pk=unrelated.pk).exists()
    assert not Pin.objects.filter(sender=alice).exists() and not Pin.objects.filter(recipient=alice).exists()
    assert counts["messages_deleted"] == 3
    event = AuditEvent.objects.get(kind="session.data_deleted")
    assert event.target == str(alice.pk) and event.detail["messages_deleted"] == 3


def test_only_an_operator_may_delete_a_sessions_data(alice_bob) -> None:
    alice, bob = alice_bob
    with pytest.raises(Forbidden):
        session_data_delete(session_id=alice.pk, actor=session_principal(bob))
    with pytest.raises(NotFound):
        session_data_delete(session_id="00000000-0000-0000-0000-000000000000", actor=OPERATOR)


def test_the_api_deletes_a_sessions_data_for_operators_only(api, register, send, operator_token) -> None:
    alice, bob = register("alice"), register("bob")
    assert send(alice, "bob", "hello").status_code == 201
    assert api.delete(f"sessions/{alice.id}/data", bob.token).status_code == 403
    r = api.delete(f"sessions/{alice.id}/data", operator_token)
    assert r.status_code == 200 and r.json_body["messages_deleted"] == 1
    assert api.get("inbox", bob.token).json_body["messages"] == []


def test_the_command_asks_for_yes_and_refuses_a_bad_id(alice_bob) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    alice, bob = alice_bob
    message_send(SendRequest(sender=alice, to="bob", text="x"))
    with pytest.raises(CommandError, match="--yes"):
        call_command("delete_session_data", str(alice.pk))
    with pytest.raises(CommandError, match="not a session id"):
        call_command("delete_session_data", "nope", "--yes")
    out = StringIO()
    call_command("delete_session_data", str(alice.pk), "--yes", stdout=out)
    assert '"messages_deleted": 1' in out.getvalue()
    assert not Message.objects.filter(sender=alice).exists()
