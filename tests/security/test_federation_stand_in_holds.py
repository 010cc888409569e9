"""What one calling hub key may take of this hub's room for held messages, its stand-ins counted
together (docs/security.md, "Stand-ins for remote senders").

Each sender id another hub names gets a stand-in session of its own, up to
SWITCHBOARD_REMOTE_SESSIONS_PER_PEER (200) per hub key: a key that counted as that many senders
would get that many senders' shares of every cap a sender has a share of. Each attack below comes
from one key, a new sender id per message, signed as a hub signs its calls.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from federation.models import RemoteSession
from messaging.models import Delivery
from tests.federation.conftest import OtherHub, federation_isolated, pin_hub

URL = "/api/v1/federation/messages"


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    federation_isolated(settings, tmp_path)
    settings.SWITCHBOARD_PEER_TOFU = True


def forward(client: Any, hub: OtherHub, *, to: str, text: str) -> Any:
    """`hub` forwards one message for `to` from a sender id it has not named before."""
    envelope = hub.envelope(to=to, text=text, sender_name=f"agent-{uuid.uuid4().hex[:8]}")
    return hub.call(client, "POST", URL, {"envelope": envelope})


def held_from(hub: OtherHub) -> int:
    """How many of `hub`'s messages wait here, whichever of its stand-ins sent them."""
    stand_ins = RemoteSession.objects.filter(hub_key=hub.public_key).values("session_id")
    return Delivery.objects.filter(state="held", message__sender_id__in=stand_ins).count()


def test_a_key_nobody_vouched_for_holds_a_bounded_number_of_messages_in_all_whatever_its_sender_ids(
    client, register, settings
):
    """Given a key made at home (first use: its messages wait for an operator) and a recipient's
    room for such holds of 4, when it sends from a new sender id each time (a stand-in each) to
    bob and to carol, then it has at most SWITCHBOARD_PEER_HOLDS_PER_KEY (2) waiting in all (the
    rest refused, 429 `hold_full`), so another key's first contact with bob is still held, and the
    operator's list of holds is not the key's to fill."""
    settings.SWITCHBOARD_HOLDS_PER_RECIPIENT = 4
    settings.SWITCHBOARD_PEER_HOLDS_PER_KEY = 2
    register("bob"), register("carol")
    flooder = OtherHub(SigningKey.generate(), name="flooder")

    answers = [
        forward(client, flooder, to=to, text=f"first contact {n}")
        for n, to in enumerate(["bob", "bob", "bob", "bob", "carol", "carol"])
    ]

    assert [a.status_code for a in answers] == [201, 201, 429, 429, 429, 429], [a.json_body for a in answers]
    assert {a.json_body["error"] for a in answers[2:]} == {"hold_full"}
    assert "2" in answers[2].json_body["detail"]  # names the cap
    assert held_from(flooder) == 2
    newcomer = OtherHub(SigningKey.generate(), name="newcomer")
    first = forward(client, newcomer, to="bob", text="hello, please pin me")
    assert first.status_code == 201 and first.json_body["status"] == "held", first.json_body
    assert not Delivery.objects.filter(state="expired").exists()


def test_a_retried_forward_of_a_held_message_is_answered_with_its_state_at_the_cap(
    client, register, settings
):
    """The cap refuses new messages only: a forward retried after its answer was lost is the one
    message, answered as before."""
    settings.SWITCHBOARD_PEER_HOLDS_PER_KEY = 1
    register("bob")
    stranger = OtherHub(SigningKey.generate(), name="stranger")
    envelope = stranger.envelope(to="bob", text="hello")
    assert stranger.call(client, "POST", URL, {"envelope": envelope}).status_code == 201

    again = stranger.call(client, "POST", URL, {"envelope": envelope})

    assert again.status_code == 200 and again.json_body["duplicate"], again.json_body


def test_a_hubs_senders_share_one_senders_room_for_messages_held_for_stopped_sessions(
    client, api, register, send, settings
):
    """Given stopped sessions whose held messages the hub caps (4 per recipient, 2 of them from one
    sender; 6 on the hub, 3 of them from one sender), when a hub sends from a new sender id each
    time (its messages held for the stopped recipients, not for an operator: a pinned key), then it
    gets one sender's share, not one per stand-in: 2 for bob, 3 on the hub, and a local sender
    still finds room on the hub for carol."""
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT = 4
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER = 2
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_HUB = 6
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB = 3
    alice, bob, carol, dave = register("alice"), register("bob"), register("carol"), register("dave")
    for stopped in (bob, carol, dave):
        api.patch("sessions/me", stopped.token, {"status": "stopped"})
    hub = OtherHub(SigningKey.generate(), name="busy-hub")
    pin_hub(hub, "lan")

    to_bob = [forward(client, hub, to="bob", text=f"for bob {n}") for n in range(4)]
    to_others = [forward(client, hub, to=to, text=f"for {to}") for to in ("carol", "dave", "dave")]

    assert [a.status_code for a in to_bob] == [201, 201, 429, 429], [a.json_body for a in to_bob]
    assert [a.status_code for a in to_others] == [201, 429, 429], [a.json_body for a in to_others]
    assert {a.json_body["error"] for a in to_bob[2:] + to_others[1:]} == {"hold_full"}
    assert held_from(hub) == 3
    local = send(alice, "carol", "see you when you are back")
    assert local.status_code == 201 and local.json_body["status"] == "held", local.json_body
