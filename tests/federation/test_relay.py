"""The relay role: leases, atomic claims, release, expiry, and refusing names nobody hosts."""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from federation.errors import LeaseHeld, NotRelay
from federation.models import RelayMessage
from federation.services.relay import (
    relay_claim,
    relay_claim_finish,
    relay_expire,
    relay_lease_take,
    relay_lookup,
    relay_store,
)
from messaging.errors import NotFound

A, B = "hub-a-key", "hub-b-key"


@pytest.fixture
def relay(settings, db):
    settings.SWITCHBOARD_ROLE = "relay"


def _store(agent="carol", dest=A, **kw):
    return relay_store(
        from_hub="sender",
        kind="message",
        message_id=str(uuid.uuid4()),
        dest_hub=dest,
        agent=agent,
        sealed=base64.b64encode(b"opaque").decode(),
        **kw,
    )[0]


def test_only_a_relay_answers(db, settings):
    settings.SWITCHBOARD_ROLE = "hub"
    with pytest.raises(NotRelay):
        relay_lookup(target="carol")


def test_a_lease_is_exclusive_until_it_lapses(relay):
    relay_lease_take(hub_key=A, agent="Carol")
    relay_lease_take(hub_key=A, agent="carol")  # renewal by the holder
    with pytest.raises(LeaseHeld):
        relay_lease_take(hub_key=B, agent="carol")
    later = timezone.now() + timedelta(hours=1)
    assert relay_lease_take(hub_key=B, agent="carol", now=later).hub_key == B


def test_messages_for_a_name_nobody_leases_are_refused(relay):
    with pytest.raises(NotFound):
        _store(agent="ghost")


def test_pulls_need_the_lease_and_each_message_is_claimed_once(relay):
    relay_lease_take(hub_key=A, agent="carol")
    stored = {str(_store().message_id) for _ in range(5)}
    with pytest.raises(LeaseHeld):
        relay_claim(hub_key=B, agent="carol")
    first = relay_claim(hub_key=A, agent="carol", limit=3)
    second = relay_claim(hub_key=A, agent="carol", limit=10)
    assert len(first) == 3 and len(second) == 2
    assert {c["message_id"] for c in first + second} == stored
    assert relay_claim(hub_key=A, agent="carol") == []


def test_a_released_claim_comes_back_and_a_done_one_loses_its_ciphertext(relay):
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    [claim] = relay_claim(hub_key=A, agent="carol")
    assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="release")
    [again] = relay_claim(hub_key=A, agent="carol")
    assert again["id"] == claim["id"]
    assert relay_claim_finish(hub_key=A, claim_id=claim["id"], outcome="done")
    row = RelayMessage.objects.get(pk=claim["id"])
    assert row.done and bytes(row.sealed) == b""
    assert relay_claim(hub_key=A, agent="carol") == []


def test_an_expired_claim_can_be_claimed_again(relay, settings):
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    [claim] = relay_claim(hub_key=A, agent="carol")
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_CLAIM_SECONDS + 1)
    relay_lease_take(hub_key=A, agent="carol", now=later)
    [again] = relay_claim(hub_key=A, agent="carol", now=later)
    assert again["id"] == claim["id"]


def test_messages_expire(relay, settings):
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    assert relay_expire() == 0
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_EXPIRY_SECONDS + 1)
    assert relay_expire(now=later) == 1
    assert not RelayMessage.objects.exists()


def test_storing_the_same_message_twice_keeps_one(relay):
    relay_lease_take(hub_key=A, agent="carol")
    mid = str(uuid.uuid4())
    sealed = base64.b64encode(b"x").decode()
    _, created = relay_store(
        from_hub="s", kind="message", message_id=mid, dest_hub=A, agent="carol", sealed=sealed
    )
    _, again = relay_store(
        from_hub="s", kind="message", message_id=mid, dest_hub=A, agent="carol", sealed=sealed
    )
    assert (created, again) == (True, False)
    assert RelayMessage.objects.count() == 1


def test_one_pull_renews_leases_claims_messages_and_reports_names_held_elsewhere(relay):
    from federation.services.relay import relay_claims_finish, relay_pull

    relay_lease_take(hub_key=B, agent="dave")
    relay_lease_take(hub_key=A, agent="carol")
    _store()
    answer = relay_pull(hub_key=A, agents=["carol", "dave", "carol"])
    assert answer["leases"] == {"carol": "ok", "dave": "held_elsewhere"}
    [claim] = answer["messages"]
    assert relay_pull(hub_key=A, agents=["carol"])["messages"] == []
    assert relay_claims_finish(hub_key=A, done=[], release=[claim["id"]]) == 1
    assert [m["id"] for m in relay_pull(hub_key=A, agents=["carol"])["messages"]] == [claim["id"]]
    assert relay_claims_finish(hub_key=B, done=[claim["id"]], release=[]) == 0  # not B's claim
