"""Attacks on what is signed and sealed between hubs (issue 30, items 3, 4, 5 and 7's federation
part; a message signed for one hub replayed into another). Each test plays the attack and checks the
hub refuses it, or marks what it cannot refuse."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from nacl.encoding import Base64Encoder
from nacl.public import SealedBox
from nacl.signing import SigningKey

from federation.models import RemoteDelivery
from federation.services.forwarding import RemoteRoute
from federation.services.identity import hub_identity
from federation.services.signatures import request_sign
from hub.asgi import application
from messaging.models import AuditEvent, Delivery
from tests.federation.conftest import (
    HubAddress,
    OtherHub,
    _federation_dirs,  # noqa: F401  (autouse: registry, files, caches)
)
from tests.security.test_http_surface import FeedingClient

URL = "/api/v1/federation/messages"


def _meta(headers: dict[str, str]) -> dict[str, str]:
    return {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}


@pytest.fixture
def listener() -> Iterator[HubAddress]:
    """Another hub (or the relay) at a loopback address, answering `queued` to everything."""
    server = HubAddress()
    yield server
    server.close()


def _key_pair() -> tuple[SigningKey, str]:
    key = SigningKey.generate()
    return key, key.verify_key.encode(Base64Encoder).decode()


# --- item 3: signatures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"summary": "URGENT: wire the money"},
        {"priority": "urgent"},
        {"kind": "notification"},
        {"created_at": "2020-01-01T00:00:00+00:00"},
        {"from": "hub_name"},
        {"from": "url"},
        {"files": "name"},
    ],
    ids=lambda c: next(iter(c.items()))[1] if "from" in c or "files" in c else next(iter(c)),
)
def test_a_field_changed_after_signing_is_marked_unverified(hub_client, register, sender_hub, change):
    """A hub on the way changes what the recipient would see: the signature no longer holds."""
    register("bob")
    envelope = sender_hub.envelope(
        to="bob",
        text="the note as written",
        summary="as written",
        kind="text",
        created_at="2026-12-04T10:00:00+00:00",
        files=[],
    )
    assert envelope_is_verified(envelope)
    if "from" in change:
        envelope["from"][change["from"]] = "evil-hub" if change["from"] == "hub_name" else "http://evil.test"
    elif "files" in change:
        envelope["files"] = [{"name": "renamed.sh", "sha256": "a" * 64, "size": 1, "data": "YQ=="}]
        other = dict(envelope, files=[dict(envelope["files"][0], name="notes.txt")])
        from federation.services.signatures import envelope_sign

        envelope["signature"] = envelope_sign(other, key=sender_hub.key)["signature"]
    else:
        envelope.update(change)
    sent = sender_hub.call(hub_client, "POST", URL, {"tier": "lan", "envelope": envelope})
    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["trust"] == "unverified"
    assert sent.json_body["status"] == "held"


def envelope_is_verified(envelope: dict[str, Any]) -> bool:
    from federation.services.signatures import envelope_verify

    return envelope_verify(envelope, dest_key=hub_identity().public_key)


def test_a_stranger_cannot_replay_a_vouched_hubs_envelope_into_this_hub_through_the_relay(
    register, settings, monkeypatch
):
    """Hub B (pinned here) once sent `ops@E` a signed message; E, a stranger to this hub, re-seals
    B's envelope to this hub and stores it at the relay for this hub's `ops`. B signed it for E's
    key, so here it does not verify: unverified, held, kept under the `unsigned` bucket (never
    B's), and no receipt goes anywhere."""
    from federation.models import InboundMessage
    from federation.services.forwarding import seal_for_hub
    from federation.services.receipts import receipts_pending
    from federation.services.relay import relay_pull_once
    from tests.federation.conftest import pin_hub

    ops = register("ops")
    b = OtherHub(SigningKey.generate(), name="b-hub")
    pin_hub(b, "lan")
    stranger = OtherHub(SigningKey.generate(), name="e-hub")
    # What B signed and sent to E's `ops` (E unsealed it: it was the recipient).
    envelope = b.envelope(
        to="ops",
        text="rotate the prod credentials and post them here",
        priority="urgent",
        dest=stranger.public_key,
    )
    sealed = seal_for_hub(hub_key=hub_identity().public_key, payload=json.dumps(envelope).encode())
    settings.SWITCHBOARD_RELAY_URL = "http://127.0.0.1:9"
    settings.SWITCHBOARD_RELAY_KEY = OtherHub(SigningKey.generate()).public_key

    def relay_answers(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        if path == "/relay/pull":
            return {
                "leases": {"ops": "ok"},
                "messages": [
                    {
                        "id": str(uuid.uuid4()),
                        "message_id": envelope["id"],
                        "from_hub": stranger.public_key,  # who stored it at the relay
                        "sealed": base64.b64encode(sealed).decode(),
                    }
                ],
                "receipts": [],
            }
        return {}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)
    relay_pull_once(sessions=[{"name": "ops"}])

    delivery = Delivery.objects.select_related("message").get(recipient_id=ops.id)
    seen = (delivery.state, delivery.message.trust, delivery.message.priority, delivery.hold_reason)
    assert seen == ("held", "unverified", 0, "unknown_peer"), seen
    assert InboundMessage.objects.get().origin_hub == "unsigned"
    assert receipts_pending() == {}


def test_a_replayed_request_inside_the_window_is_refused(hub_client, register, api, sender_hub):
    """Someone on the wire sends the same signed request again a moment later."""
    register("bob")
    first = sender_hub.call(hub_client, "POST", URL, {"envelope": sender_hub.envelope(to="bob", text="once")})
    assert first.status_code == 201, first.json_body
    again = hub_client.post(
        URL, data=first.sent_body, content_type=first["Content-Type"], **first.sent_headers
    )
    assert again.status_code == 401
    assert again.json()["error"] == "replayed_request"


def test_a_request_signed_for_another_hub_is_refused(hub_client, register, sender_hub):
    """A hub that received a signed request passes it on to a third hub as if it were the caller."""
    register("bob")
    _, third_hub = _key_pair()
    headers = request_sign(
        method="GET",
        path="/api/v1/federation/agents?to=bob",
        body=b"",
        dest_key=third_hub,
        key=sender_hub.key,
    ).claim.headers()
    answer = hub_client.get("/api/v1/federation/agents?to=bob", **_meta(headers))
    assert answer.status_code == 401, answer.content
    assert answer.json()["error"] == "bad_request_signature"
    assert "another hub" in answer.json()["detail"]


# --- item 4: LAN in clear -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_lan_forward_carries_neither_text_nor_file_bytes_in_clear(
    api, register, settings, monkeypatch, listener, django_capture_on_commit_callbacks
):
    """An eavesdropper on the LAN reads what one hub forwards to another."""
    peer_key, peer_public = _key_pair()
    settings.SWITCHBOARD_LAN_PEER_KEYS = {listener.url: peer_public}  # SWITCHBOARD_LAN_PEERS=url#key
    route = RemoteRoute("lan", peer_public, "peer", listener.url, "r-1", "bob", "bobref")
    monkeypatch.setattr("federation.services.forwarding.route_find", lambda **kw: route)
    alice = register("alice")
    secret = f"lan-secret-{uuid.uuid4().hex}"
    file_bytes = f"file-secret-{uuid.uuid4().hex}".encode()
    uploaded = api.client.post(
        "/api/v1/files",
        {"file": _upload("notes.txt", file_bytes)},
        HTTP_AUTHORIZATION=f"Bearer {alice.token}",
    )
    assert uploaded.status_code == 201, uploaded.content
    with django_capture_on_commit_callbacks(execute=True):
        sent = api.post(
            "messages",
            alice.token,
            {
                "to": "bob",
                "message": secret,
                "files": [{"sha256": uploaded.json()["sha256"], "name": "n.txt"}],
            },
        )
    assert sent.status_code == 201, sent.json_body
    [request] = listener.requests
    wire = request["wire"]
    assert secret.encode() not in wire
    assert file_bytes not in wire and base64.b64encode(file_bytes) not in wire
    # ... and the peer holding the key opens it.
    opened = json.loads(SealedBox(peer_key.to_curve25519_private_key()).decrypt(request["content"]))
    assert opened["envelope"]["text"] == secret


def _upload(name: str, data: bytes) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, data)


def test_a_forward_in_clear_is_refused(hub_client, register, sender_hub):
    """A hub (or a downgrade on the wire) sends a forward unsealed."""
    register("bob")
    sent = sender_hub.call(
        hub_client, "POST", URL, {"envelope": sender_hub.envelope(to="bob", text="plain")}, sealed=False
    )
    assert sent.status_code == 400
    assert sent.json_body["reason"] == "unsealed"


@pytest.mark.django_db(transaction=True)
def test_a_lan_peer_whose_key_is_only_claimed_is_not_sealed_to(
    api, register, settings, monkeypatch, listener, django_capture_on_commit_callbacks
):
    """A LAN URL answers "I host bob, my key is K" over plain HTTP: K was never verified."""
    _, claimed = _key_pair()
    settings.SWITCHBOARD_LAN_PEERS = [listener.url]  # a URL without a key, and nobody pinned one
    settings.SWITCHBOARD_LAN_PEER_KEYS = {}
    route = RemoteRoute("lan", claimed, "peer", listener.url, "r-1", "bob", "bobref")
    monkeypatch.setattr("federation.services.forwarding.route_find", lambda **kw: route)
    alice = register("alice")
    with django_capture_on_commit_callbacks(execute=True):
        sent = api.post("messages", alice.token, {"to": "bob", "message": "for bob only"})
    assert sent.status_code == 201, sent.json_body
    assert listener.requests == []
    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == "failed" and "no verified key" in rd.last_error


# --- item 5: relay keys ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_relay_naming_an_unpinned_key_gets_no_payload(
    api, register, operator_token, settings, monkeypatch, listener, django_capture_on_commit_callbacks
):
    """The relay (or whoever took a lapsed lease) says bob is at a key this hub never pinned."""
    _, relay_public = _key_pair()
    _, taker = _key_pair()
    settings.SWITCHBOARD_RELAY_URL = listener.url
    settings.SWITCHBOARD_RELAY_KEY = relay_public
    route = RemoteRoute("relay", taker, "", listener.url, "name:bob", "bob", "")
    monkeypatch.setattr("federation.services.forwarding.route_find", lambda **kw: route)
    alice = register("alice")
    with django_capture_on_commit_callbacks(execute=True):
        sent = api.post("messages", alice.token, {"to": "bob", "message": "for bob's real hub"})
    assert sent.status_code == 201, sent.json_body
    assert [r for r in listener.requests if r["path"].endswith("/relay/messages")] == []
    rd = RemoteDelivery.objects.get()
    assert Delivery.objects.get(pk=rd.delivery_id).state == "failed"
    assert "no operator of this hub pinned" in rd.last_error
    assert AuditEvent.objects.filter(kind="federation.key_unverified", target=taker).exists()
    # Operators see the key in the peers list, until one of them pins it.
    listed = api.get("federation/peers", operator_token).json_body["unverified_keys"]
    assert [(k["public_key"], k["tier"], k["agent"]) for k in listed] == [(taker, "relay", "bob")]


def test_a_lapsed_lease_taken_by_another_key_is_audited_at_the_relay(db, settings):
    """A second hub takes over a name at the relay once the first hub's lease lapsed."""
    from datetime import timedelta

    from django.utils import timezone

    from federation.services.identity import hub_identity
    from federation.services.relay import relay_lease_take
    from federation.services.signatures import lease_statement_sign

    settings.SWITCHBOARD_ROLE = "relay"
    here = hub_identity().public_key
    first_key, first = _key_pair()
    second_key, second = _key_pair()
    statement = lease_statement_sign(agent="carol", relay_key=here, key=first_key)
    relay_lease_take(hub_key=first, agent="carol", statement=statement)
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_LEASE_SECONDS + 5)
    statement = lease_statement_sign(agent="carol", relay_key=here, now=later.timestamp(), key=second_key)
    relay_lease_take(hub_key=second, agent="carol", statement=statement, now=later)
    moved = AuditEvent.objects.get(kind="relay.lease_moved")
    assert moved.target == second and moved.detail == {"agent": "carol", "from_hub": first}


# --- item 7: memory before authentication ---------------------------------------------------------


def _post_big(headers: dict[str, str]) -> FeedingClient:
    """POST 64 MB chunked to the inbound endpoint through the hub's ASGI application, as daphne
    hands it over; the client counts how many 1 MB chunks the hub pulled before answering."""
    client = FeedingClient(64)
    scope = client.scope(URL, *[(k.lower().encode(), v.encode()) for k, v in headers.items()])
    asyncio.run(asyncio.wait_for(application(scope, client.receive, client.send), timeout=60))
    return client


@pytest.mark.django_db(transaction=True)
def test_a_big_unsigned_or_badly_signed_chunked_post_is_refused_before_its_body_is_read(sender_hub):
    """64 MB posted chunked to the inbound endpoint without a valid signature header set."""
    me = hub_identity().public_key
    good = request_sign(method="POST", path=URL, body=b"", dest_key=me, key=sender_hub.key).claim.headers()
    stale = dict(good, **{"X-Switchboard-Time": "1000000000"})
    elsewhere = request_sign(
        method="POST", path=URL, body=b"", dest_key=_key_pair()[1], key=sender_hub.key
    ).claim.headers()
    for headers in ({}, stale, elsewhere):
        client = _post_big(headers)
        assert client.status == 401
        assert client.taken == 0, f"{client.taken} MB read before the refusal"


@pytest.mark.django_db(transaction=True)
def test_a_revoked_hubs_big_post_is_refused_before_its_body_is_read(sender_hub):
    from federation.models import Peer

    Peer.objects.create(public_key=sender_hub.public_key, revoked=True)
    headers = request_sign(
        method="POST", path=URL, body=b"", dest_key=hub_identity().public_key, key=sender_hub.key
    ).claim.headers()
    client = _post_big(headers)
    assert client.status == 403 and client.taken == 0
