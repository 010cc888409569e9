"""Where this hub calls out on another hub's word: receipts go back only to an address this hub
holds for the origin's key from a verified source (its registry, a configured LAN peer, a pin),
never to the URL a forwarded message claims. A home-made key signs its own envelopes, so "it
signed the message and called directly" proves the key, not that the URL in it is the key's: a
claimed URL would let any key (or a pinned hub) make this hub POST to an address of its choosing.
Each attack goes through the HTTP API with a signed call, as another hub makes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from nacl.signing import SigningKey

from federation.services.signatures import envelope_sign
from tests.federation.conftest import OtherHub, federation_isolated, pin_hub

URL = "/api/v1/federation/messages"
CALLER_ADDRESS = "127.0.0.2"  # where the calling hub's requests come from
# What the envelope claims: a service on this hub's own loopback, path chosen by the '#'; never called.
CLAIMED_URL = "http://127.0.0.1:9/internal-admin#"
PINNED_URL = "http://127.0.0.1:18765"  # the address an operator pinned for the key


@pytest.fixture
def client(db: None) -> Client:
    """The test client as another hub's requests reach this hub: from CALLER_ADDRESS."""
    return Client(REMOTE_ADDR=CALLER_ADDRESS)


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    federation_isolated(settings, tmp_path)
    settings.SWITCHBOARD_PEER_TOFU = True


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every hub-to-hub call the receipts flush makes (method, base URL, path)."""
    made: list[tuple[str, str, str]] = []

    def fake_call(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        made.append((method, base_url, path))
        return {"applied": 0}

    monkeypatch.setattr("federation.services.receipts.hub_call", fake_call)
    return made


def _claiming(hub: OtherHub, url: str, **fields: Any) -> dict[str, Any]:
    envelope = hub.envelope(**fields)
    envelope["from"]["url"] = url
    return envelope_sign(envelope, key=hub.key)


def test_a_key_nobody_vouched_for_gets_no_receipt_at_the_url_it_claims(
    client, api, register, operator_token, calls
):
    """A home-made key forwards a message (held, `unknown_peer`) claiming an internal URL; the
    operator denies it. The receipt flush must not POST to the claimed URL."""
    from federation.services.receipts import receipts_flush

    register("bob")
    stranger = OtherHub(SigningKey.generate(), name="stranger")
    sent = stranger.call(
        client, "POST", URL, {"envelope": _claiming(stranger, CLAIMED_URL, to="bob", text="hi")}
    )
    assert sent.json_body["status"] == "held", sent.json_body
    [hold] = [h for h in api.get("holds", operator_token).json_body["holds"]]
    assert api.post(f"holds/{hold['id']}/deny", operator_token, {"reason": "who?"}).status_code == 200

    receipts_flush()

    assert [c for c in calls if c[1].startswith("http://127.0.0.1:9")] == []


def test_a_pinned_hubs_receipts_go_to_its_pinned_address_not_the_one_its_message_claims(
    client, api, register, calls
):
    """A hub an operator pinned at PINNED_URL signs messages that claim another URL: receipts for
    them go to the pinned address only."""
    from federation.models import Peer
    from federation.services.receipts import receipts_flush

    bob = register("bob")
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "lan")
    Peer.objects.filter(public_key=peer.public_key).update(url=PINNED_URL)
    sent = peer.call(client, "POST", URL, {"envelope": _claiming(peer, CLAIMED_URL, to="bob", text="hello")})
    assert sent.json_body["status"] == "queued", sent.json_body
    assert len(api.get("inbox", bob.token).json_body["messages"]) == 1

    receipts_flush()

    assert calls == [("POST", PINNED_URL, "/federation/receipts")]


def test_a_configured_lan_peer_gets_its_receipts_at_its_configured_address(
    client, api, register, settings, calls
):
    """The ordinary case keeps working: a peer configured as `url#key` claims that same URL."""
    from federation.services.receipts import receipts_flush

    bob = register("bob")
    peer = OtherHub(SigningKey.generate(), name="peer")
    settings.SWITCHBOARD_LAN_PEERS = [PINNED_URL]
    settings.SWITCHBOARD_LAN_PEER_KEYS = {PINNED_URL: peer.public_key}
    sent = peer.call(client, "POST", URL, {"envelope": _claiming(peer, PINNED_URL, to="bob", text="hello")})
    assert sent.json_body["status"] == "queued", sent.json_body
    api.get("inbox", bob.token)

    receipts_flush()

    assert calls == [("POST", PINNED_URL, "/federation/receipts")]


def test_a_hub_pinned_by_key_alone_gets_receipts_only_at_the_address_it_calls_from(
    client, api, register, calls
):
    """A hub pinned without a URL (this hub holds no address for it) is sent receipts at the URL
    its messages name only when that URL's host is the address its call came from: it cannot point
    them at anything else (CLAIMED_URL), and its own address keeps receipts working."""
    from federation.services.receipts import receipts_flush

    bob = register("bob")
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "lan")
    own = f"http://{CALLER_ADDRESS}:18766"
    for claimed in (CLAIMED_URL, own):
        sent = peer.call(client, "POST", URL, {"envelope": _claiming(peer, claimed, to="bob", text=claimed)})
        assert sent.json_body["status"] == "queued", sent.json_body
    assert len(api.get("inbox", bob.token).json_body["messages"]) == 2

    receipts_flush()

    assert calls == [("POST", own, "/federation/receipts")]


def test_behind_a_proxy_the_callers_address_is_not_a_way_back(client, api, register, calls):
    """Behind a proxy every caller's connection comes from the proxy's address (often this very
    machine's loopback), and the address in its forwarding header is the client's claim: a hub
    pinned by key alone that calls through one is sent no receipt at the URL it names, not even
    at the proxy's address."""
    from federation.services.receipts import receipts_flush

    bob = register("bob")
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "lan")
    through_proxy = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="127.0.0.1")
    for claimed in ("http://127.0.0.1:9/internal-admin#", f"http://{CALLER_ADDRESS}:18766"):
        sent = peer.call(
            through_proxy, "POST", URL, {"envelope": _claiming(peer, claimed, to="bob", text=claimed)}
        )
        assert sent.json_body["status"] == "queued", sent.json_body
    assert len(api.get("inbox", bob.token).json_body["messages"]) == 2

    receipts_flush()

    assert calls == []


def _pulled_from_relay(monkeypatch: pytest.MonkeyPatch, envelopes: list[dict[str, Any]], agent: str) -> None:
    """This hub pulls `envelopes` (sealed to it) from its relay for `agent`, as a relay hands them over."""
    import base64
    import json
    import uuid

    from federation.services.forwarding import seal_for_hub
    from federation.services.identity import hub_identity
    from federation.services.relay import relay_pull_once

    items = [
        {
            "id": str(uuid.uuid4()),
            "message_id": e["id"],
            "from_hub": e["from"]["hub"],
            "sealed": base64.b64encode(
                seal_for_hub(hub_key=hub_identity().public_key, payload=json.dumps(e).encode())
            ).decode(),
        }
        for e in envelopes
    ]

    def relay_answers(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        if path == "/relay/pull":
            return {"leases": {agent: "ok"}, "messages": items, "receipts": []}
        return {}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)
    relay_pull_once(sessions=[{"name": agent}])


def test_a_key_nobody_vouched_for_gets_no_receipts_through_the_relay(
    api, register, operator_token, settings, monkeypatch, calls
):
    """A home-made key sends messages through the relay; they are held (`unknown_peer`) and
    expire or are denied. A receipt batch for that key would be stored at the relay under this
    hub's key, where the stranger never pulls it: each one counts against this hub's quota there
    (SWITCHBOARD_RELAY_PENDING_PER_HUB) for a day, so a stream of them would shut this hub's own
    sends through the relay out. None is stored."""
    from federation.services.receipts import receipts_flush

    register("ops")
    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key
    stranger = OtherHub(SigningKey.generate(), name="stranger")
    _pulled_from_relay(monkeypatch, [stranger.envelope(to="ops", text=f"note {i}") for i in range(3)], "ops")
    holds = api.get("holds", operator_token).json_body["holds"]
    assert len(holds) == 3 and {h["hold_reason"] for h in holds} == {"unknown_peer"}
    for hold in holds:
        assert api.post(f"holds/{hold['id']}/deny", operator_token, {"reason": "who?"}).status_code == 200

    receipts_flush()

    assert calls == []


def test_a_pinned_hub_gets_its_receipts_through_the_relay(api, register, settings, monkeypatch, calls):
    """The ordinary relay case keeps working: a pinned origin's message, read here, is reported
    back through the relay."""
    from federation.services.receipts import receipts_flush

    ops = register("ops")
    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "relay")
    _pulled_from_relay(monkeypatch, [peer.envelope(to="ops", text="hello")], "ops")
    assert len(api.get("inbox", ops.token).json_body["messages"]) == 1

    receipts_flush()

    assert calls == [("POST", "http://127.0.0.1:9", "/relay/messages")]
