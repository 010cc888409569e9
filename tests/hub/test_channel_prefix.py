"""Hubs given different databases of one Redis server do not hear each other's live events."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings
from redis.connection import parse_url

from hub.settings import channel_layer_prefix
from tests.local_redis import local_redis_url


def test_the_prefix_names_the_database_however_the_url_gives_it() -> None:
    assert channel_layer_prefix("redis://127.0.0.1:6379/3") == "switchboard.db3."
    assert channel_layer_prefix("redis://127.0.0.1:6379") == "switchboard.db0."
    assert channel_layer_prefix("redis://127.0.0.1:6379/0") == "switchboard.db0."
    assert channel_layer_prefix("redis://h:6379/0?db=5") == "switchboard.db5."
    assert channel_layer_prefix("unix:///run/redis.sock?db=4") == "switchboard.db4."


def test_the_settings_give_the_layer_its_database_s_prefix() -> None:
    if not settings.REDIS_URL:
        pytest.skip("embedded mode: the in-memory channel layer")
    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    assert config["prefix"] == channel_layer_prefix(settings.REDIS_URL)


async def _heard(sender: RedisPubSubChannelLayer, listener: RedisPubSubChannelLayer, group: str) -> bool:
    """Whether a group send through `sender` reaches a channel of `listener` in that group."""
    channel = await listener.new_channel()
    await listener.group_add(group, channel)
    try:
        await asyncio.sleep(0.1)  # the subscription is in place before the send
        await sender.group_send(group, {"type": "hub.event", "kind": "probe"})
        try:
            await asyncio.wait_for(listener.receive(channel), timeout=1.0)
        except TimeoutError:
            return False
        return True
    finally:
        await listener.group_discard(group, channel)


@pytest.mark.asyncio
async def test_hubs_on_two_databases_of_one_server_do_not_hear_each_other() -> None:
    where = parse_url(local_redis_url())
    server = f"redis://{where.get('host', '127.0.0.1')}:{where.get('port', 6379)}"
    one, two = f"{server}/1", f"{server}/2"
    group = f"operators-{uuid.uuid4().hex}"  # what both hubs' consoles join, under a name of this test's
    layers = []

    def layer(url: str, prefix: str) -> RedisPubSubChannelLayer:
        made = RedisPubSubChannelLayer(hosts=[{"address": url}], prefix=prefix)
        layers.append(made)
        return made

    try:
        # The premise: with the channel names alone, database numbers keep nothing apart.
        assert await _heard(layer(one, "asgi"), layer(two, "asgi"), group)
        # Each database's own prefix: the other database's hub is not heard, the same one's is.
        listener = layer(two, channel_layer_prefix(two))
        assert not await _heard(layer(one, channel_layer_prefix(one)), listener, group)
        assert await _heard(layer(two, channel_layer_prefix(two)), listener, group)
    finally:
        for made in layers:
            await made.flush()
