"""A pull whose answer is lost must not strand the messages it handed over.

The hub may commit a pull (its messages become `delivered`) and still fail to answer: PostgreSQL can
die while the commit is being acknowledged, or the connection can drop on the way back. The client
then asks for delivered-but-unacked messages on its next pull, so the agent still sees them.
"""

from __future__ import annotations

from typing import Any

import pytest

from messaging.models import Delivery
from switchboard_agent.client import HubClient, HubError
from tests.agents.lossy import LosesAnswers


@pytest.mark.parametrize("answer", ["503", "dropped"])
def test_the_next_pull_returns_what_a_lost_pull_handed_over(
    inprocess_hub: str, register: Any, send: Any, answer: str
) -> None:
    alice, bob = register("alice"), register("bob")
    sent = send(alice, "bob", "the build is green").json_body["id"]
    transport = LosesAnswers(HubClient.default_transport, lose=1, answer=answer)
    client = HubClient(inprocess_hub, bob.token, transport=transport)

    # The hub handed the message over, but bob's client never saw the answer
    with pytest.raises(HubError):
        client.inbox()
    assert Delivery.objects.get(message_id=sent).state == "delivered"

    # Its next pull gets the message all the same, and then it is back to plain pulls
    assert [m["id"] for m in client.inbox()] == [sent]
    assert client.inbox() == []
    includes_unacked = [url.params.get("include_unacked") for url in transport.pulls]
    assert includes_unacked == [None, "true", None]


def test_a_refused_pull_changes_nothing_on_the_next(inprocess_hub: str, register: Any) -> None:
    bob = register("bob")
    client = HubClient(inprocess_hub, bob.token)

    with pytest.raises(HubError) as refused:
        client.inbox(limit=0)  # refused before anything moved (400)

    assert refused.value.status == 400
    assert client.pull_unsettled is False
