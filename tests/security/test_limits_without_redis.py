"""The attack: one session token, while the hub's Redis (the rate-limit store) is unreachable.
The per-session bounds kept there (team changes, long-polls at once, a pair's send rate) must
still hold, in each process, rather than let everything through until Redis is back."""

from __future__ import annotations

import logging
import uuid

import pytest

from messaging.services import limits
from teams.models import Team
from tests.security.test_one_token_teams import churn_teams

# A loopback port nothing listens on: every call to this "Redis" is refused at once.
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture
def redis_down(settings):
    settings.REDIS_URL = UNREACHABLE_REDIS
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-no-redis-{uuid.uuid4().hex}"
    limits._stores.pop(UNREACHABLE_REDIS, None)
    yield
    limits._stores.pop(UNREACHABLE_REDIS, None)


def test_team_churn_is_bounded_while_redis_is_unreachable(api, register, settings, redis_down):
    settings.SWITCHBOARD_TEAM_CHANGE_RATE = 4
    settings.SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS = 3600
    eve = register("eve")
    assert churn_teams(api, eve.token, rounds=3) == [201, 200, 201, 200, 429]
    assert Team.objects.count() == 2


def test_a_pair_send_rate_holds_while_redis_is_unreachable(api, register, send, settings, redis_down):
    settings.SWITCHBOARD_RATE_PAIR = 2
    settings.SWITCHBOARD_RATE_PAIR_SECONDS = 3600
    alice, _bob = register("alice"), register("bob")
    answers = [send(alice, "bob", f"note {n}") for n in range(3)]
    assert [a.status_code for a in answers] == [201, 201, 429]
    assert answers[2].json_body["reason"] == "pair_rate"


def test_the_outage_is_logged_once_a_minute_not_per_request(caplog):
    store = limits.SharedBuckets(limits.RedisBuckets(UNREACHABLE_REDIS))
    want = limits.Want(f"test-no-redis-{uuid.uuid4().hex}", 2, 10, 1)
    with caplog.at_level(logging.WARNING, logger=limits.log.name):
        answers = [store.take_many([want], 0.0) for _ in range(3)]
        store.give_back([want])
    assert answers == [[(1, 0.0)], [(1, 0.0)], [(0, pytest.approx(5.0))]]
    assert len([r for r in caplog.records if "rate-limit store unavailable" in r.message]) == 1
