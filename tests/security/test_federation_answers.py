"""Answers between hubs, and what someone on the path can make of them. Every hub-to-hub call is
signed by the caller, and its answer by the hub that answers, bound to the request it answers
(`federation.services.signatures.answer_headers`). Each attack is played against this hub:

- as the hub that calls: something at a LAN peer's (or the relay's) address answers a forward or a
  "do you host bob?" itself, re-signs it with another key, alters the peer's own answer, or replays
  the peer's answer to another request. Each counts as no answer: the forward stays `relayed` and
  is retried (never `read`, never `failed`), the lookup finds nothing, and operators see it in the
  audit (`federation.answer_refused`), once however often it happens;
- as the hub that answers: its answers verify for the request they answer and for no other, and
  what someone on the path gets it to sign (the genuine headers with another body, another time,
  another path) answers no request the caller made.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from nacl.encoding import Base64Encoder
from nacl.signing import SigningKey

from federation.models import Peer, RemoteDelivery, RevocationMode
from federation.services.forwarding import RemoteRoute, forward_attempt
from federation.services.identity import hub_identity
from federation.services.signatures import (
    ANSWER_NONCE_HEADER,
    ANSWER_SIGNATURE_HEADER,
    NONCE_HEADER,
    HubRequest,
    answer_problem,
    request_sign,
)
from hub.asgi import application
from messaging.models import AuditEvent, Delivery
from tests.federation.conftest import (
    Answer,
    HubAddress,
    OtherHub,
    _federation_dirs,  # noqa: F401  (autouse: registry, files, caches)
    signed_by,
    unsigned,
)


def _public(key: SigningKey) -> str:
    return key.verify_key.encode(Base64Encoder).decode()


@pytest.fixture
def peer_key() -> SigningKey:
    """Bob's hub's own key."""
    return SigningKey.generate()


@pytest.fixture
def peer(settings: Any, monkeypatch: pytest.MonkeyPatch, peer_key: SigningKey) -> Iterator[HubAddress]:
    """Bob's hub, a LAN peer whose key this hub holds from a verified source
    (`SWITCHBOARD_LAN_PEERS=url#key`), at a loopback address whose answers the test writes. Sends
    to bob go there, until it is excluded (re-routing finds no other hub)."""
    address = HubAddress()
    public = _public(peer_key)
    settings.SWITCHBOARD_LAN_PEERS = [address.url]
    settings.SWITCHBOARD_LAN_PEER_KEYS = {address.url: public}
    route = RemoteRoute("lan", public, "bobs-hub", address.url, "r-1", "bob", "bobref")

    def find(*, target: str, exclude: set[str] | None = None, tiers: Any = None) -> RemoteRoute | None:
        return None if public in (exclude or set()) else route

    monkeypatch.setattr("federation.services.forwarding.route_find", find)
    try:
        yield address
    finally:
        address.close()


def _send(api: Any, sender: Any, capture: Any, text: str = "for bob") -> Delivery:
    """`sender` sends to bob; the forward is handed over before the send is answered."""
    with capture(execute=True):
        sent = api.post("messages", sender.token, {"to": "bob", "message": text})
    assert sent.status_code == 201, sent.json_body
    return Delivery.objects.get(message_id=sent.json_body["id"])


def _waiting(delivery: Delivery) -> tuple[str, str]:
    """The delivery's state and its forward's: ("relayed", "retry") for one still on its way,
    to be tried again (what no answer leaves)."""
    rd = RemoteDelivery.objects.get(delivery_id=delivery.pk)
    return Delivery.objects.get(pk=delivery.pk).state, rd.remote_state


def _refused() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind="federation.answer_refused"))


# --- the hub that calls ----------------------------------------------------------------------------

FORGERIES: dict[str, tuple[Callable[[SigningKey, dict[str, Any]], Answer], str]] = {
    "read, unsigned": (lambda key, request: unsigned(201, {"status": "read"}), "unsigned"),
    "read, signed by another key": (
        lambda key, request: signed_by(SigningKey.generate(), request, 201, {"status": "read"}),
        "another hub key",
    ),
    "the peer's queued, altered to read": (
        lambda key, request: signed_by(
            key, request, 201, {"status": "queued"}, sent=(201, {"status": "read"})
        ),
        "does not verify",
    ),
    "403, unsigned": (
        lambda key, request: unsigned(403, {"error": "peer_revoked", "detail": "revoked"}),
        "unsigned",
    ),
    "the peer's 201, altered to 403": (
        lambda key, request: signed_by(
            key, request, 201, {"status": "queued"}, sent=(403, {"error": "peer_revoked"})
        ),
        "does not verify",
    ),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_answer_to_a_forward_is_no_answer(
    api, register, peer, peer_key, forgery, django_capture_on_commit_callbacks
):
    """Given something at bob's hub's LAN address answers alice's forward with an answer that is
    not bob's hub's own to that request, when alice sends (and the forward is tried again), then
    none of it is applied: her delivery stays `relayed`, never `read` or `failed`, the forward is
    retried, and the operators find it in the audit once, however often it happens."""
    forge, why = FORGERIES[forgery]
    peer.answer = lambda request: forge(peer_key, request)
    alice = register("alice")

    delivery = _send(api, alice, django_capture_on_commit_callbacks)

    assert _waiting(delivery) == ("relayed", "retry")
    rd = RemoteDelivery.objects.get()
    assert rd.attempts == 1 and rd.next_attempt_at is not None
    assert "counts as no answer" in rd.last_error and why in rd.last_error
    assert forward_attempt(delivery_id=delivery.pk) == "retry"  # the retry meets the same
    assert _waiting(delivery) == ("relayed", "retry")
    assert len(peer.exchanges) == 2
    [event] = _refused()
    assert event.target == _public(peer_key)
    assert event.detail["path"] == "/api/v1/federation/messages" and why in event.detail["why"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("nonce", ["as it was", "renamed to the new request's"])
def test_the_peers_answer_replayed_for_another_request_is_no_answer(
    api, register, peer, peer_key, nonce, django_capture_on_commit_callbacks
):
    """Given bob's hub answered alice's first forward `read` itself (signed, for that request),
    when whoever is on the path hands the same answer to her second forward (as it was, or naming
    the second request's nonce), then the second is not `read`: it stays `relayed`, retried."""
    peer.answer = lambda request: signed_by(peer_key, request, 201, {"status": "read"})
    alice = register("alice")
    first = _send(api, alice, django_capture_on_commit_callbacks, "first")
    assert Delivery.objects.get(pk=first.pk).state == "read"  # the peer's own word is taken
    _, (status, body, headers) = peer.exchanges[0]

    def replay(request: dict[str, Any]) -> Answer:
        if nonce == "as it was":
            return status, body, headers
        return status, body, {**headers, ANSWER_NONCE_HEADER: request["headers"][NONCE_HEADER]}

    peer.answer = replay
    second = _send(api, alice, django_capture_on_commit_callbacks, "second")

    assert _waiting(second) == ("relayed", "retry")
    [event] = _refused()
    if nonce == "as it was":
        assert event.detail["why"] == "the answer to another request"
    else:
        assert event.detail["why"].startswith("a signature that does not verify")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("status", "body", "state", "remote_state"),
    [
        (201, {"message_id": "x", "status": "queued", "duplicate": False}, "relayed", "queued"),
        (
            403,
            {"error": "peer_revoked", "detail": "An operator of this hub revoked yours."},
            "failed",
            "failed",
        ),
    ],
    ids=["queued there", "refused there"],
)
def test_the_peers_own_answers_are_taken(
    api, register, peer, peer_key, status, body, state, remote_state, django_capture_on_commit_callbacks
):
    """Given bob's hub answers alice's forward itself, signed for that request, then its word is
    taken as before: queued there (her delivery `relayed`, its remote state `queued`), or refused
    (`failed` at once, with bob's hub's reason). Nothing is audited as refused."""
    peer.answer = lambda request: signed_by(peer_key, request, status, body)
    alice = register("alice")

    delivery = _send(api, alice, django_capture_on_commit_callbacks)

    assert Delivery.objects.get(pk=delivery.pk).state == state
    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == remote_state
    if state == "failed":
        assert "revoked yours" in Delivery.objects.get(pk=delivery.pk).decision_reason
    assert _refused() == []


@pytest.mark.django_db(transaction=True)
def test_the_peers_answer_to_a_copy_of_the_request_is_retried_not_failed(
    api, register, peer, peer_key, django_capture_on_commit_callbacks
):
    """Given someone on the path delivered alice's forward to bob's hub twice and hands her bob's
    hub's own answer to the copy (401 `replayed_request`, genuinely signed for that request), then
    the forward is retried, not failed: the retry, signed afresh, gets the answer for the message
    bob's hub took the first time."""
    peer.answer = lambda request: signed_by(
        peer_key, request, 401, {"error": "replayed_request", "detail": "already received once"}
    )
    alice = register("alice")

    delivery = _send(api, alice, django_capture_on_commit_callbacks)

    assert _waiting(delivery) == ("relayed", "retry")
    peer.answer = lambda request: signed_by(peer_key, request, 200, {"status": "queued", "duplicate": True})
    assert forward_attempt(delivery_id=delivery.pk) == "queued"


@pytest.mark.django_db
def test_a_forged_yes_to_do_you_host_bob_is_no_route(peer, peer_key):
    """Given something at a LAN peer's address answers "do you host bob?" yes, naming the peer's
    own key (which it cannot sign with), then this hub takes no route from it; the peer's own
    signed yes is one."""
    from federation.services.forwarding import hosts_cache_clear, hosts_lookup

    yes = {"hosted": True, "hub_key": _public(peer_key), "hub_name": "bobs-hub", "id": "r-1", "name": "bob"}
    peer.answer = lambda request: unsigned(200, yes)
    assert hosts_lookup(peer.url, "bob") is None
    assert [event.detail["path"] for event in _refused()] == ["/api/v1/federation/agents"]

    hosts_cache_clear()
    peer.answer = lambda request: signed_by(peer_key, request, 200, yes)
    assert hosts_lookup(peer.url, "bob") == yes


@pytest.mark.django_db
@pytest.mark.parametrize(
    "first",
    ["forged no", "forged yes, another key", "re-signed by another key", "the peer's own 503"],
)
def test_an_answer_to_do_you_host_bob_that_is_not_the_peers_word_is_not_remembered(
    peer, peer_key, first, monkeypatch
):
    """Given something at a LAN peer's address answers "do you host bob?" itself (a forged no, a
    forged yes, an answer re-signed with another key), or the peer fails for now (503), then this
    hub finds no route, asks no more for UNANSWERED_LOOKUP_SECONDS (a burst of sends waits on a
    peer that is down once), and then asks again: the peer's own signed yes is a route. (Remembered
    as "not hosted" for SWITCHBOARD_HOSTS_CACHE_SECONDS, one forged answer would keep bob
    unreachable from here for a minute.)"""
    from federation.services import lookups
    from federation.services.forwarding import hosts_lookup
    from federation.services.lookups import UNANSWERED_LOOKUP_SECONDS

    clock = [1000.0]
    monkeypatch.setattr(lookups, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))

    no = {"hosted": False, "hub_key": _public(peer_key), "hub_name": "bobs-hub"}
    yes = {"hosted": True, "hub_key": _public(peer_key), "hub_name": "bobs-hub", "id": "r-1", "name": "bob"}
    answers: dict[str, Callable[[dict[str, Any]], Answer]] = {
        "forged no": lambda request: unsigned(200, no),
        "forged yes, another key": lambda request: unsigned(
            200, dict(yes, hub_key=_public(SigningKey.generate()))
        ),
        "re-signed by another key": lambda request: signed_by(SigningKey.generate(), request, 200, no),
        "the peer's own 503": lambda request: signed_by(peer_key, request, 503, {"error": "unavailable"}),
    }
    peer.answer = answers[first]
    assert hosts_lookup(peer.url, "bob") is None

    peer.answer = lambda request: signed_by(peer_key, request, 200, yes)
    clock[0] += UNANSWERED_LOOKUP_SECONDS - 1
    assert hosts_lookup(peer.url, "bob") is None
    assert len(peer.requests) == 1
    clock[0] += 1
    assert hosts_lookup(peer.url, "bob") == yes


@pytest.mark.django_db
def test_the_peers_own_no_to_do_you_host_bob_is_remembered(peer, peer_key):
    """The peer's own signed "no" is its word: remembered for SWITCHBOARD_HOSTS_CACHE_SECONDS, so
    a burst of sends to a name it does not host asks it once."""
    from federation.services.forwarding import hosts_lookup

    no = {"hosted": False, "hub_key": _public(peer_key), "hub_name": "bobs-hub"}
    peer.answer = lambda request: signed_by(peer_key, request, 200, no)
    assert hosts_lookup(peer.url, "bob") is None
    peer.answer = lambda request: signed_by(
        peer_key, request, 200, dict(no, hosted=True, id="r-1", name="bob")
    )
    assert hosts_lookup(peer.url, "bob") is None
    assert len(peer.requests) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("first", ["forged, empty", "the peer's own 503"])
def test_an_agent_list_that_is_not_the_peers_word_is_not_remembered(peer, peer_key, first, monkeypatch):
    """Given the directory asks a LAN peer which agents it hosts, and gets an answer the peer did
    not sign (an empty list forged at its address) or the peer's 503, then the directory
    lists none of the peer's agents and asks no more for UNANSWERED_LOOKUP_SECONDS, as "do you host
    X?" (`federation.services.lookups`); then it asks again and lists what the peer's own signed
    answer names. (Remembered for SWITCHBOARD_HOSTS_CACHE_SECONDS, one forged answer would hide the
    peer's agents from the directory for a minute.)"""
    from federation.services import lookups
    from federation.services.discovery import remote_agents_list
    from federation.services.lookups import UNANSWERED_LOOKUP_SECONDS

    clock = [1000.0]
    monkeypatch.setattr(lookups, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    listed = {
        "hub_key": _public(peer_key),
        "hub_name": "bobs-hub",
        "agents": [{"id": "r-1", "name": "bob", "ref": "bobref", "status": "idle"}],
    }
    answers: dict[str, Callable[[dict[str, Any]], Answer]] = {
        "forged, empty": lambda request: unsigned(200, dict(listed, agents=[])),
        "the peer's own 503": lambda request: signed_by(peer_key, request, 503, {"error": "unavailable"}),
    }
    peer.answer = answers[first]
    assert remote_agents_list() == []

    peer.answer = lambda request: signed_by(peer_key, request, 200, listed)
    clock[0] += UNANSWERED_LOOKUP_SECONDS - 1
    assert remote_agents_list() == []
    assert len(peer.requests) == 1
    clock[0] += 1
    assert [(r["name"], r["tier"], r["hub"]) for r in remote_agents_list()] == [("bob", "lan", "bobs-hub")]


@pytest.mark.django_db
def test_the_peers_own_agent_list_is_remembered(peer, peer_key):
    """The peer's own signed list is its word: remembered for SWITCHBOARD_HOSTS_CACHE_SECONDS, so
    the directory asks it once for a burst of reads."""
    from federation.services.discovery import remote_agents_list

    listed = {"hub_key": _public(peer_key), "hub_name": "bobs-hub", "agents": []}
    peer.answer = lambda request: signed_by(peer_key, request, 200, listed)
    assert remote_agents_list() == []
    peer.answer = lambda request: signed_by(
        peer_key,
        request,
        200,
        dict(listed, agents=[{"id": "r-1", "name": "bob", "ref": "b", "status": "idle"}]),
    )
    assert remote_agents_list() == []
    assert len(peer.requests) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "forged",
    [(201, {"id": "stored", "created": True}), (429, {"error": "relay_quota", "detail": "full"})],
    ids=["stored", "quota full"],
)
def test_a_forged_answer_from_the_relays_address_is_no_answer(
    api, register, settings, monkeypatch, forged, django_capture_on_commit_callbacks
):
    """Given something at the relay's URL answers alice's hand-over without the relay's signature,
    `stored` (so that nobody would ever look for it) or "your quota is full" (so that it fails),
    then neither is taken: the message is retried, and goes to the relay once the relay's own
    answer (signed with the key configured for it) says it keeps it."""
    relay = HubAddress()
    relay_key, bobs_hub = SigningKey.generate(), _public(SigningKey.generate())
    settings.SWITCHBOARD_RELAY_URL = relay.url
    settings.SWITCHBOARD_RELAY_KEY = _public(relay_key)
    Peer.objects.create(public_key=bobs_hub, name="bobs-hub", tier="lan", pinned=True)
    route = RemoteRoute("relay", bobs_hub, "bobs-hub", relay.url, "name:bob", "bob", "")
    monkeypatch.setattr("federation.services.forwarding.route_find", lambda **kw: route)
    try:
        relay.answer = lambda request: unsigned(*forged)
        alice = register("alice")

        delivery = _send(api, alice, django_capture_on_commit_callbacks)

        assert _waiting(delivery) == ("relayed", "retry")
        relay.answer = lambda request: signed_by(relay_key, request, 201, {"id": "stored", "created": True})
        assert forward_attempt(delivery_id=delivery.pk) == "at_relay"
    finally:
        relay.close()


# --- the hub that answers ---------------------------------------------------------------------------


def _call(
    client: Any,
    caller: OtherHub,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    sent_body: bytes | None = None,
    sent_path: str | None = None,
    changed: dict[str, str] | None = None,
) -> tuple[HubRequest, Any]:
    """`caller` signs a request to this hub and it is sent through the test client; `sent_body`,
    `sent_path` and `changed` headers replace what goes on the wire (changed on the way). Returns
    the request as the caller signed it and the hub's answer."""
    request = request_sign(
        method=method,
        path=path,
        body=body,
        dest_key=hub_identity().public_key,
        key=caller.key,
        name=caller.name,
    )
    headers = {**request.claim.headers(), **(changed or {})}
    meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    response = client.generic(
        method,
        sent_path or path,
        data=body if sent_body is None else sent_body,
        content_type="application/json",
        **meta,
    )
    return request, response


def _problem(request: HubRequest, response: Any) -> str | None:
    """Why the caller of `request` would not take `response` as this hub's answer to it."""
    return answer_problem(
        request,
        status=response.status_code,
        body=response.content,
        headers=response.headers,
        dest_key=hub_identity().public_key,
    )


@pytest.mark.django_db
def test_the_hubs_answers_are_signed_for_the_request_they_answer(hub_client, register, sender_hub):
    """Given another hub asks this one whether it hosts bob, reports receipts, and forwards a
    message for a name nobody here has, then each answer (a 200 and an error made after the body
    was read) verifies as this hub's answer to that request, and to no other request."""
    register("bob")
    calls = [
        ("GET", "/api/v1/federation/agents?to=bob", b""),
        ("POST", "/api/v1/federation/receipts", b'{"receipts": []}'),
        ("POST", "/api/v1/federation/messages", json.dumps({"envelope": {"to": "x"}}).encode()),
    ]
    for method, path, body in calls:
        request, response = _call(hub_client, sender_hub, method, path, body)
        assert response.status_code in (200, 400), response.content
        assert _problem(request, response) is None, (path, response.status_code)
        again, _ = _call(hub_client, sender_hub, method, path, body)
        assert _problem(again, response) == "the answer to another request"


@pytest.mark.django_db
def test_what_someone_on_the_path_gets_signed_answers_no_request_the_caller_made(
    hub_client, register, sender_hub
):
    """Given someone on the path takes another hub's genuine request headers and sends them to
    this hub with another body, another time, or to another path, then this hub's (signed) error
    answers the request it got, and the calling hub, checking it against what it signed, refuses
    it: a genuine 401 or 404 cannot be passed off as the answer to the genuine request."""
    register("bob")
    receipts = "/api/v1/federation/receipts"
    body = b'{"receipts": []}'
    other_body = _call(hub_client, sender_hub, "POST", receipts, body, sent_body=b'{"receipts": [1]}')
    stale = _call(
        hub_client, sender_hub, "POST", receipts, body, changed={"X-Switchboard-Time": "1000000000"}
    )
    elsewhere = _call(hub_client, sender_hub, "POST", receipts, body, sent_path="/api/v1/relay/pull")
    for (request, response), status in ((other_body, 401), (stale, 401), (elsewhere, 404)):
        assert response.status_code == status, response.content
        assert response.headers.get(ANSWER_SIGNATURE_HEADER), "the hub signs its errors too"
        assert _problem(request, response).startswith("a signature that does not verify")


@pytest.mark.django_db
def test_an_answer_to_a_body_refused_past_the_cap_is_not_signed(hub_client, sender_hub, monkeypatch):
    """Given a request whose body passes the cap while this hub reads it, then its 413 is not
    signed: the body it rests on was never hashed, and bound to the headers alone it would pass
    for the answer to the genuine request those headers came with."""
    monkeypatch.setattr("federation.api.MAX_HUB_BODY", 16)
    body = json.dumps({"receipts": [{"message_id": "m", "state": "read"}]}).encode()
    request, response = _call(hub_client, sender_hub, "POST", "/api/v1/federation/receipts", body)
    assert response.status_code == 413
    assert _problem(request, response) == "unsigned"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/federation/messages", b"{}"),
        ("GET", "/api/v1/federation/agents?to=bob%20smith", b""),
        ("DELETE", "/api/v1/relay/leases/bob%20smith", b""),
    ],
    ids=["forward", "do you host", "lease drop"],
)
async def test_a_refusal_before_the_body_is_read_is_signed_for_the_caller(sender_hub, method, path, body):
    """Given a hub this hub revoked (mode `refuse`) calls it (a forward, a question with a query,
    a path with an escaped name), then the ASGI handler's refusal, made before a byte of the body
    is read, is signed for that request as the caller signed it: the calling hub takes the 403 as
    this hub's own (a genuine refusal still fails its forward at once)."""
    from asgiref.sync import sync_to_async

    await sync_to_async(Peer.objects.create)(
        public_key=sender_hub.public_key, revoked=True, revocation_mode=RevocationMode.REFUSE
    )
    request = await sync_to_async(request_sign)(
        method=method, path=path, body=body, dest_key=hub_identity().public_key, key=sender_hub.key
    )
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as http:
        response = await http.request(method, path, content=body, headers=request.claim.headers())
    assert response.status_code == 403 and response.json()["error"] == "peer_revoked"
    assert _problem(request, response) is None


# --- the relay's key, read from the relay -----------------------------------------------------------


def test_the_relays_key_read_from_its_url_is_kept_and_a_different_one_later_is_refused(db, settings):
    """Given a hub told the relay's URL but not its key, when something else answers at that URL at
    a later hourly re-read (on the path, or in the relay's place) with a key of its own, then that
    key is refused and audited: it would sign "stored" for messages it drops. The operator who
    knows the relay's key really changed configures it, and that key is used."""
    from federation.errors import TransientError
    from federation.services.keys import relay_key, relay_key_forget

    relay, first, other = HubAddress(), SigningKey.generate(), SigningKey.generate()
    settings.SWITCHBOARD_RELAY_URL = relay.url
    settings.SWITCHBOARD_RELAY_KEY = ""
    relay_key_forget()
    try:
        relay.answer = lambda request: unsigned(200, {"public_key": _public(first), "role": "relay"})
        assert relay_key() == _public(first)
        relay_key_forget()  # an hour later: read again
        relay.answer = lambda request: unsigned(200, {"public_key": _public(other), "role": "relay"})

        with pytest.raises(TransientError, match="first used"):
            relay_key()

        [changed] = AuditEvent.objects.filter(kind="federation.relay_key_changed")
        assert changed.detail["kept"] == _public(first) and changed.detail["said"] == _public(other)
        settings.SWITCHBOARD_RELAY_KEY = _public(other)
        assert relay_key() == _public(other)
    finally:
        relay_key_forget()
        relay.close()
