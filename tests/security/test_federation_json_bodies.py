"""How much work one hub-to-hub body can make: a body is at most 280 MB (files travel in it as
base64), but JSON of that size made of tiny values (`[{},{},...]`) takes some twenty times its
size once parsed. Any key may sign a call while trust on first use is on, and anyone may seal a
message to this hub's public key, so this hub parses no body (request, sealed forward, relay item
or answer) holding more JSON values than any hub-to-hub body does: a message's text, every other
field and some room."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from tests.federation.conftest import OtherHub, federation_isolated

VALUES = 1_000_000  # `{}` values in the hostile body: 3 MB raw, about 70 MB once parsed


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    federation_isolated(settings, tmp_path)
    settings.SWITCHBOARD_PEER_TOFU = True
    settings.SWITCHBOARD_MAX_MESSAGE_CHARS = 10_000  # legitimate bodies stay far below VALUES


def _flat(n: int) -> bytes:
    return b'{"receipts": [' + b"{}," * (n - 1) + b"{}]}"


def _peak(work: Any) -> tuple[Any, int]:
    """What `work()` returns, and the most memory Python held while it ran."""
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_stranger_cannot_make_this_hub_parse_a_body_of_tiny_json_values(db: None, client: Any) -> None:
    """A home-made key posts a 3 MB receipts body of a million empty objects: it is refused
    (400, reason `too_many_values`) before it is parsed, so it never takes memory many times its size."""
    stranger = OtherHub(SigningKey.generate(), name="stranger")
    body = _flat(VALUES)

    response, peak = _peak(lambda: _raw_call(client, stranger, "/api/v1/federation/receipts", body))

    assert response.status_code == 400, response.content[:300]
    assert response.json()["reason"] == "too_many_values"
    assert peak < 8 * len(body), f"peak {peak} bytes for a {len(body)} byte body"


def test_a_sealed_forward_of_tiny_json_values_is_refused_too(db: None, client: Any) -> None:
    """The same body sealed to this hub (anyone can: the key is public) as a forward."""
    from federation.services.forwarding import seal_for_hub
    from federation.services.identity import hub_identity
    from federation.transport import SEALED_TYPE

    stranger = OtherHub(SigningKey.generate(), name="stranger")
    body = _flat(VALUES)
    sealed = seal_for_hub(hub_key=hub_identity().public_key, payload=body)

    response, peak = _peak(
        lambda: _raw_call(client, stranger, "/api/v1/federation/messages", sealed, content_type=SEALED_TYPE)
    )

    assert response.status_code == 400, response.content[:300]
    assert response.json()["reason"] == "too_many_values"
    assert peak < 8 * len(body), f"peak {peak} bytes for a {len(body)} byte body"


def test_a_relay_item_of_tiny_json_values_is_dropped_unparsed(
    db: None, settings: Any, monkeypatch: Any
) -> None:
    """A message pulled from the relay (sealed to this hub by anyone who stored it there) made of
    tiny values is dropped unparsed (done at the relay: a retry cannot help)."""
    body = _flat(VALUES)

    (item, finished), peak = _peak(lambda: _pull_one(body, settings, monkeypatch))

    assert finished == [{"done": [item["id"]], "release": []}]
    assert peak < 8 * len(body), f"peak {peak} bytes for a {len(body)} byte item"


def test_a_legitimate_message_with_a_long_text_of_commas_still_goes_through(
    client: Any, register: Any, api: Any, settings: Any
) -> None:
    """The bound leaves room for the longest text a message may have, all of it `,[{`."""
    from tests.federation.conftest import pin_hub

    bob = register("bob")
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "lan")
    text = ",[{" * (settings.SWITCHBOARD_MAX_MESSAGE_CHARS // 3)
    sent = peer.call(
        client, "POST", "/api/v1/federation/messages", {"envelope": peer.envelope(to="bob", text=text)}
    )
    assert sent.status_code == 201, sent.json_body
    [frame] = api.get("inbox", bob.token).json_body["messages"]
    assert frame["text"] == text


def _pull_one(body: bytes, settings: Any, monkeypatch: Any) -> tuple[dict[str, str], list[Any]]:
    """One pull cycle of the hub for its agent `ops` from a relay whose answer holds one message,
    `body` sealed to this hub: the item, and what the hub then told the relay (done, released)."""
    import base64
    import uuid

    from federation.services.forwarding import seal_for_hub
    from federation.services.identity import hub_identity
    from federation.services.relay import relay_pull_once

    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key
    sealed = seal_for_hub(hub_key=hub_identity().public_key, payload=body)
    item = {"id": str(uuid.uuid4()), "message_id": str(uuid.uuid4()), "from_hub": "x"}
    item["sealed"] = base64.b64encode(sealed).decode()
    finished: list[Any] = []

    def relay_answers(method: str, base_url: str, path: str, data: Any = None, **kw: Any) -> Any:
        if path == "/relay/pull":
            return {"leases": {"ops": "ok"}, "messages": [item], "receipts": [], "more": False}
        finished.append(data)
        return {}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)
    relay_pull_once(sessions=[{"name": "ops"}])
    return item, finished


def _raw_call(
    client: Any, hub: OtherHub, path: str, raw: bytes, content_type: str = "application/json"
) -> Any:
    """A signed POST of `raw` as it is (not JSON-encoded by the test)."""
    from federation.services.identity import hub_identity
    from federation.services.signatures import request_sign

    headers = request_sign(
        method="POST", path=path, body=raw, dest_key=hub_identity().public_key, key=hub.key, name=hub.name
    ).claim.headers()
    meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(path, data=raw, content_type=content_type, **meta)


# --- text the database cannot store ---------------------------------------------------------------


def test_a_forward_whose_text_the_database_cannot_store_is_refused(
    client: Any, register: Any, settings: Any
) -> None:
    """A NUL character (PostgreSQL's text cannot hold one) in a forwarded message is refused with a
    400, as the API refuses it from an agent: never a server error the sending hub retries."""
    from messaging.models import Message
    from tests.federation.conftest import pin_hub

    register("bob")
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "lan")
    envelope = peer.envelope(to="bob", text="before\x00after")

    sent = peer.call(client, "POST", "/api/v1/federation/messages", {"envelope": envelope})

    assert sent.status_code == 400, sent.content[:300]
    assert sent.json()["reason"] == "unstorable_text"
    assert not Message.objects.exists()


def test_a_relay_item_whose_text_the_database_cannot_store_is_dropped(
    register: Any, settings: Any, monkeypatch: Any
) -> None:
    """Pulled from the relay, the same message is done there (dropped): released, it would come
    back at every pull for its whole day at the relay."""
    import json

    from messaging.models import Message
    from tests.federation.conftest import pin_hub

    register("ops")
    peer = OtherHub(SigningKey.generate(), name="peer")
    pin_hub(peer, "relay")
    envelope = peer.envelope(to="ops", text="before\x00after")

    item, finished = _pull_one(json.dumps(envelope).encode(), settings, monkeypatch)

    assert finished == [{"done": [item["id"]], "release": []}]
    assert not Message.objects.exists()
