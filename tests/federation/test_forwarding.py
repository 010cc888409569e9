"""Sending to another hub's agent: routing, forwarding with retries and re-routing, receipts,
isolation. The other hubs are stood in for by replacing `hub_call` (the HTTP transport)."""

from __future__ import annotations

import base64
import json
from contextlib import contextmanager

import httpx
import pytest
from django.utils import timezone
from nacl.encoding import Base64Encoder
from nacl.public import SealedBox
from nacl.signing import SigningKey

from federation.errors import PermanentError, TransientError, Unreachable
from federation.models import FileUpload, RemoteDelivery
from federation.services.forwarding import MAX_FORWARD_ATTEMPTS, RemoteRoute, forward_attempt
from federation.services.receipts import receipts_from_hub
from messaging.models import AuditEvent, Delivery
from tests.federation.conftest import answer_signed

# Transactional: background jobs run after a real commit (and may close the connection, as they do
# in a hub), which a wrapping test transaction on PostgreSQL would not survive.
pytestmark = pytest.mark.django_db(transaction=True)

_KEYS = {}
for _key in (SigningKey.generate(), SigningKey.generate()):
    _KEYS[_key.verify_key.encode(Base64Encoder).decode()] = _key
HUB_B, HUB_C = list(_KEYS)
_RELAY_SIGNING_KEY = SigningKey.generate()
RELAY = _RELAY_SIGNING_KEY.verify_key.encode(Base64Encoder).decode()
_ANSWERING = {**_KEYS, RELAY: _RELAY_SIGNING_KEY}  # who signs the answers of `relay_http`


class FakeHubs:
    """Records calls; answers from a queue of results (dicts, or exceptions to raise)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, object]] = []
        self.answers: list[object] = []

    def __call__(self, method, base_url, path, body=None, **kw):
        if kw.get("sealed") is not None:  # forwarded to a hub: sealed to its key
            key = _KEYS[kw["dest_key"]].to_curve25519_private_key()
            body = json.loads(SealedBox(key).decrypt(kw["sealed"]))
        self.calls.append((method, base_url, path, body))
        answer = self.answers.pop(0) if self.answers else {"status": "queued"}
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture(autouse=True)
def _verified_keys(monkeypatch):
    """Hubs B and C's keys come from verified sources: the registry, a configured LAN peer, an
    operator's pin (for the relay tier)."""
    monkeypatch.setattr("federation.services.forwarding.registry_hub_keys", lambda: {"b": HUB_B, "c": HUB_C})
    monkeypatch.setattr("federation.services.forwarding.hub_key_pinned", lambda key: key in _KEYS)
    monkeypatch.setattr("federation.services.forwarding.relay_key", lambda: RELAY)


@pytest.fixture
def hubs(monkeypatch):
    fake = FakeHubs()
    monkeypatch.setattr("federation.services.forwarding.hub_call", fake)
    return fake


@pytest.fixture
def routes(monkeypatch):
    """The routes `route_find` will answer, in order of the tiers; each call skips excluded hubs."""
    table: list[RemoteRoute] = []

    def find(*, target, exclude=None, tiers=None):
        for route in table:
            if route.hub_key not in (exclude or set()) and route.name == target:
                return route
        return None

    monkeypatch.setattr("federation.services.forwarding.route_find", find)
    # A LAN peer's key is the one configured (or pinned) for its URL: here, its route's.
    monkeypatch.setattr(
        "federation.services.forwarding.lan_peer_key",
        lambda url: next((r.hub_key for r in table if r.url == url and r.tier == "lan"), None),
    )
    return table


def _route(tier="channel", hub=HUB_B, name="bob"):
    return RemoteRoute(tier, hub, f"hub-{tier}", f"http://{tier}.invalid", f"id-{hub[:3]}", name, "bobref")


def _send(api, sender, to, text, capture, **fields):
    with capture(execute=True):
        return api.post("messages", sender.token, {"to": to, "message": text, **fields})


def test_an_unknown_name_with_no_hub_hosting_it_is_not_found(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    assert _send(api, alice, "bob", "hi", django_capture_on_commit_callbacks).status_code == 404
    assert hubs.calls == []


def test_a_remote_agent_gets_a_relayed_delivery_forwarded_signed(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    from federation.services.signatures import envelope_verify

    alice = register("alice")
    routes.append(_route())
    sent = _send(api, alice, "bob", "over there", django_capture_on_commit_callbacks)
    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["status"] == "relayed"
    assert "channel tier" in sent.json_body["result"]
    [(method, url, path, body)] = hubs.calls
    assert (method, url, path) == ("POST", "http://channel.invalid", "/federation/messages")
    assert body["envelope"]["text"] == "over there"
    assert envelope_verify(body["envelope"], dest_key=HUB_B)  # made for the hub it is sealed to
    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == "queued" and rd.tier == "channel"
    assert Delivery.objects.get(pk=rd.delivery_id).state == "relayed"
    status = api.get(f"messages/{sent.json_body['id']}", alice.token).json_body
    assert status["deliveries"][0]["remote"]["remote_state"] == "queued"


def test_remote_agents_are_never_local_recipients_or_listed_as_local(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route())
    _send(api, alice, "bob", "first", django_capture_on_commit_callbacks)
    listed = api.get("agents", alice.token).json_body["agents"]
    assert [a["name"] for a in listed] == ["alice"]


def test_transient_failures_are_retried_with_backoff_then_failed(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route(tier="lan"))
    hubs.answers = [TransientError("503")] * (MAX_FORWARD_ATTEMPTS + 1)
    _send(api, alice, "bob", "flaky", django_capture_on_commit_callbacks)
    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == "retry" and rd.attempts == 1 and rd.next_attempt_at is not None
    for _ in range(MAX_FORWARD_ATTEMPTS):
        forward_attempt(delivery_id=rd.delivery_id)
    rd.refresh_from_db()
    assert rd.remote_state == "failed"
    assert Delivery.objects.get(pk=rd.delivery_id).state == "failed"


def test_a_hub_that_no_longer_hosts_the_agent_sends_it_to_the_next_tier(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.extend([_route("channel", HUB_B), _route("lan", HUB_C)])
    hubs.answers = [PermanentError(404, {"error": "not_found"}), {"status": "queued"}]
    _send(api, alice, "bob", "moved on", django_capture_on_commit_callbacks)
    rd = RemoteDelivery.objects.get()
    assert (rd.tier, rd.hub_key, rd.remote_state) == ("lan", HUB_C, "queued")
    assert Delivery.objects.get(pk=rd.delivery_id).tier == "lan"
    assert [c[1] for c in hubs.calls] == ["http://channel.invalid", "http://lan.invalid"]


def test_an_unreachable_channel_hub_falls_through_to_the_next(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.extend([_route("channel", HUB_B), _route("relay", HUB_C)])
    hubs.answers = [Unreachable("refused"), {"id": "x"}]
    _send(api, alice, "bob", "via relay then", django_capture_on_commit_callbacks)
    rd = RemoteDelivery.objects.get()
    assert (rd.tier, rd.remote_state) == ("relay", "at_relay")
    relay_call = hubs.calls[-1]
    assert relay_call[2] == "/relay/messages"
    assert "via relay then" not in str(relay_call[3])  # sealed: the relay never sees the text


def test_receipts_move_the_senders_delivery(api, register, routes, hubs, django_capture_on_commit_callbacks):
    alice = register("alice")
    routes.append(_route())
    sent = _send(api, alice, "bob", "tell me when read", django_capture_on_commit_callbacks)
    message_id = sent.json_body["id"]
    assert (
        receipts_from_hub(hub_key=HUB_C, receipts=[{"message_id": message_id, "state": "read"}]) == 0
    )  # wrong hub
    assert receipts_from_hub(hub_key=HUB_B, receipts=[{"message_id": message_id, "state": "read"}]) == 1
    status = api.get(f"messages/{message_id}", alice.token).json_body
    assert status["status"] == "read"
    assert [h["state"] for h in status["history"] if h["state"]][-2:] == ["delivered", "read"]


def test_a_refusal_at_the_other_hub_fails_the_delivery(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route())
    hubs.answers = [{"status": "refused"}]
    sent = _send(api, alice, "bob", "no thanks", django_capture_on_commit_callbacks)
    assert api.get(f"messages/{sent.json_body['id']}", alice.token).json_body["status"] == "failed"


def test_isolation_holds_what_leaves_the_machine_until_an_operator_approves(
    api, register, routes, hubs, settings, operator_token, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route(tier="lan"))
    settings.SWITCHBOARD_ISOLATED = True
    sent = _send(api, alice, "bob", "leaving?", django_capture_on_commit_callbacks)
    assert sent.json_body["status"] == "held"
    assert hubs.calls == []
    delivery = Delivery.objects.get(message_id=sent.json_body["id"])
    assert delivery.hold_reason == "isolation"
    from messaging.principals import operator_principal
    from messaging.services.holds import holds_decide

    with django_capture_on_commit_callbacks(execute=True):
        holds_decide(delivery_ids=[delivery.pk], approve=True, actor=operator_principal("op"))
    assert len(hubs.calls) == 1
    assert RemoteDelivery.objects.get().remote_state == "queued"


def test_isolation_leaves_the_channel_tier_alone(
    api, register, routes, hubs, settings, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route(tier="channel"))
    settings.SWITCHBOARD_ISOLATED = True
    assert (
        _send(api, alice, "bob", "same machine", django_capture_on_commit_callbacks).json_body["status"]
        == "relayed"
    )


def test_a_session_can_be_isolated_by_an_operator_only(
    api, register, routes, hubs, operator_token, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route(tier="relay"))
    assert (
        api.call("PUT", f"federation/isolation/{alice.id}", alice.token, {"isolated": True}).status_code
        == 403
    )
    assert (
        api.call("PUT", f"federation/isolation/{alice.id}", operator_token, {"isolated": True}).status_code
        == 200
    )
    assert _send(api, alice, "bob", "held?", django_capture_on_commit_callbacks).json_body["status"] == "held"


def test_files_too_large_for_the_tier_are_refused_before_anything_is_kept(
    api, register, routes, hubs, monkeypatch, django_capture_on_commit_callbacks
):
    from federation.services import files

    monkeypatch.setitem(files.TIER_LIMITS, "relay", (10, 20))
    alice = register("alice")
    routes.append(_route(tier="relay"))
    stored = files.file_store(data=b"x" * 11)
    FileUpload.objects.create(session_id=alice.id, attachment=stored, size=11, uploaded_at=timezone.now())
    sent = _send(
        api,
        alice,
        "bob",
        "big",
        django_capture_on_commit_callbacks,
        files=[{"sha256": stored.sha256, "name": "big.bin"}],
    )
    assert sent.status_code == 413, sent.json_body
    assert not Delivery.objects.exists()


def test_a_stopped_local_agent_is_held_here_even_when_another_hub_hosts_its_name(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice, bob = register("alice"), register("bob")
    api.patch("sessions/me", bob.token, {"status": "stopped"})
    routes.append(_route())
    sent = _send(api, alice, "bob", "you moved", django_capture_on_commit_callbacks)
    assert sent.json_body["status"] == "held", sent.json_body
    assert Delivery.objects.get().hold_reason == "recipient_stopped"
    assert hubs.calls == []


def test_a_stopped_local_agent_hosted_nowhere_else_is_held_here(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice, bob = register("alice"), register("bob")
    api.patch("sessions/me", bob.token, {"status": "stopped"})
    sent = _send(api, alice, "bob", "wait for me", django_capture_on_commit_callbacks)
    assert sent.json_body["status"] == "held"
    assert Delivery.objects.get().hold_reason == "recipient_stopped"


def test_re_routing_never_takes_an_unapproved_message_off_the_machine(
    api, register, routes, hubs, settings, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.extend([_route("channel", HUB_B), _route("lan", HUB_C)])
    settings.SWITCHBOARD_ISOLATED = True
    hubs.answers = [PermanentError(404, {"error": "not_found"})]
    sent = _send(api, alice, "bob", "stay home", django_capture_on_commit_callbacks)
    # Jobs run inline here: the channel forward was over before the answer, which says how it ended.
    assert sent.json_body["status"] == "failed"
    assert [c[1] for c in hubs.calls] == ["http://channel.invalid"]
    assert Delivery.objects.get().state == "failed"


def test_a_relay_message_nobody_pulled_fails_after_the_relay_expiry(
    api, register, routes, hubs, settings, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from federation.services.forwarding import forwards_expire_unclaimed

    alice = register("alice")
    routes.append(_route(tier="relay"))
    hubs.answers = [{"id": "stored"}]
    _send(api, alice, "bob", "anyone?", django_capture_on_commit_callbacks)
    assert forwards_expire_unclaimed() == 0
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_EXPIRY_SECONDS + 7200)
    assert forwards_expire_unclaimed(now=later) == 1
    assert Delivery.objects.get().state == "failed"


def test_a_channel_hub_gone_from_the_registry_is_retried_not_sealed_to(
    api, register, routes, hubs, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr("federation.services.forwarding.registry_hub_keys", lambda: {})
    alice = register("alice")
    routes.append(_route("channel", HUB_B))
    _send(api, alice, "bob", "wait for it", django_capture_on_commit_callbacks)
    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == "retry" and "registry" in rd.last_error
    assert hubs.calls == []


def test_a_batch_sends_to_a_remote_agent_with_its_local_messages(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    """A batch item addressed to another hub's agent goes through the same pipeline as the local
    ones, written with them: relayed and forwarded, each local one queued."""
    alice, _carol = register("alice"), register("carol")
    routes.append(_route())
    batch = [{"to": "carol", "message": "here"}, {"to": "bob", "message": "over there"}]
    with django_capture_on_commit_callbacks(execute=True):
        sent = api.post(
            "messages/batch", alice.token, {"messages": [*batch, {"to": "carol", "message": "again"}]}
        )
    assert sent.status_code == 201, sent.json_body
    assert [r["status"] for r in sent.json_body["results"]] == ["queued", "relayed", "queued"]
    [(method, url, path, body)] = hubs.calls
    assert (method, url, path) == ("POST", "http://channel.invalid", "/federation/messages")
    assert body["envelope"]["text"] == "over there"
    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == "queued" and str(rd.message_id) == sent.json_body["results"][1]["id"]


# --- receipts through the relay ----------------------------------------------------------------------


@contextmanager
def _acting_as(settings, tmp_path, key: SigningKey):
    """Run this hub's code as the hub holding `key` (its home, its identity) for the block."""
    home = tmp_path / f"home-{key.verify_key.encode(Base64Encoder).decode()[:8].replace('/', '_')}"
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "hub.key").write_text(base64.b64encode(bytes(key)).decode() + "\n")
    before = settings.SWITCHBOARD_HOME
    settings.SWITCHBOARD_HOME = home
    try:
        yield
    finally:
        settings.SWITCHBOARD_HOME = before


@pytest.fixture
def relayed_to_b(api, register, routes, hubs, django_capture_on_commit_callbacks) -> str:
    """alice's message to bob@B, handed to the relay (its id: no secret, bob's frame carries it)."""
    alice = register("alice")
    routes.append(_route(tier="relay", hub=HUB_B))
    hubs.answers = [{"id": "stored"}]
    sent = _send(api, alice, "bob", "through the relay", django_capture_on_commit_callbacks)
    assert sent.json_body["status"] == "relayed", sent.json_body
    return sent.json_body["id"]


def _opened_here(sealed: bytes) -> int:
    """What this hub's relay pull does with a receipt batch sealed to it."""
    from federation.services.forwarding import unseal
    from federation.services.receipts import receipts_open_relayed

    return receipts_open_relayed(payload=unseal(sealed))


def test_a_receipt_batch_b_signed_for_another_hub_is_not_believed_here(relayed_to_b, settings, tmp_path):
    """Given alice's message went to bob@B through the relay, and Mallory sent bob@B a message of
    her own under the same id (B keeps it apart, under her key), when B reports to Mallory that her
    copy was read (a batch B signs and seals to her) and Mallory seals B's batch to this hub and
    stores it at the relay for it, then this hub does not believe it: alice's delivery stays
    relayed and the refusal is audited. (The relay, holding a batch it could open, could do the
    same.)"""
    from federation.services.forwarding import seal_for_hub
    from federation.services.identity import hub_identity
    from federation.services.receipts import receipts_sealed_for_relay

    mallory = SigningKey.generate()
    mallory_key = mallory.verify_key.encode(Base64Encoder).decode()
    with _acting_as(settings, tmp_path, _KEYS[HUB_B]):
        for_mallory = receipts_sealed_for_relay(
            origin_hub=mallory_key, receipts=[{"message_id": relayed_to_b, "state": "read"}]
        )
    signed_by_b = SealedBox(mallory.to_curve25519_private_key()).decrypt(for_mallory)

    assert _opened_here(seal_for_hub(hub_key=hub_identity().public_key, payload=signed_by_b)) == 0

    assert Delivery.objects.get(message_id=relayed_to_b).state == "relayed"
    assert RemoteDelivery.objects.get().remote_state == "at_relay"
    [rejected] = AuditEvent.objects.filter(kind="federation.receipt_rejected")
    assert rejected.detail["hub_key"] == HUB_B and "another hub" in rejected.detail["why"]


def test_a_receipt_batch_b_signed_for_this_hub_moves_the_senders_delivery(relayed_to_b, settings, tmp_path):
    """Given alice's message went to bob@B through the relay, when B reports it read in a batch it
    signs for this hub, then alice's delivery is read."""
    from federation.services.identity import hub_identity
    from federation.services.receipts import receipts_sealed_for_relay

    here = hub_identity().public_key
    with _acting_as(settings, tmp_path, _KEYS[HUB_B]):
        for_here = receipts_sealed_for_relay(
            origin_hub=here, receipts=[{"message_id": relayed_to_b, "state": "read"}]
        )
    assert _opened_here(for_here) == 1
    assert Delivery.objects.get(message_id=relayed_to_b).state == "read"


@pytest.mark.parametrize(
    ("batches", "shown", "state"),
    [
        (["delivered", "queued"], "delivered", "delivered"),
        (["queued", "held"], "queued", "relayed"),
        (["read", "delivered"], "read", "read"),
    ],
)
def test_a_stale_receipt_batch_never_moves_the_remote_state_back(
    relayed_to_b, settings, tmp_path, batches, shown, state
):
    """Given alice's message went to bob@B through the relay, when B's receipt batches reach this
    hub out of order (a later one first, then one B made before it), then the stale one is
    ignored: the remote state shown for the delivery stays where the later batch put it, as the
    delivery state order (`messaging.states`) says, and so does the delivery."""
    from federation.services.identity import hub_identity
    from federation.services.receipts import receipts_sealed_for_relay

    here = hub_identity().public_key
    with _acting_as(settings, tmp_path, _KEYS[HUB_B]):
        sealed = [
            receipts_sealed_for_relay(
                origin_hub=here, receipts=[{"message_id": relayed_to_b, "state": state}]
            )
            for state in batches
        ]
    for batch in sealed:
        _opened_here(batch)

    assert RemoteDelivery.objects.get().remote_state == shown
    assert Delivery.objects.get(message_id=relayed_to_b).state == state


def test_a_forwards_answer_never_takes_back_a_receipt_that_came_first(
    api, register, routes, monkeypatch, django_capture_on_commit_callbacks
):
    """Given a forward to bob@B whose answer (queued) is slow, when B's receipt that bob read it
    comes back before this hub records that answer, then the answer does not take the remote
    state back: it stays read."""
    from federation.services.receipts import receipts_from_hub

    alice = register("alice")
    routes.append(_route(tier="lan"))

    def answered_after_the_receipt(method, base_url, path, body=None, **kw):
        rd = RemoteDelivery.objects.get()
        receipts_from_hub(hub_key=HUB_B, receipts=[{"message_id": str(rd.message_id), "state": "read"}])
        return {"status": "queued"}

    monkeypatch.setattr("federation.services.forwarding.hub_call", answered_after_the_receipt)
    sent = _send(api, alice, "bob", "read before answered", django_capture_on_commit_callbacks)

    assert RemoteDelivery.objects.get().remote_state == "read"
    assert Delivery.objects.get(message_id=sent.json_body["id"]).state == "read"


def test_a_receipt_batch_that_names_no_destination_is_refused_and_audited(relayed_to_b):
    """Given a batch in the format hubs used before batches named their destination (B's
    signature over the receipts alone, which any hub that opened it could pass on), when it
    reaches this hub, then it is refused and the refusal says why."""
    from federation.services.forwarding import seal_for_hub
    from federation.services.identity import hub_identity
    from federation.services.signatures import sign_bytes

    receipts = [{"message_id": relayed_to_b, "state": "read"}]
    signed = json.dumps({"receipts": receipts}, separators=(",", ":")).encode()
    old = {"hub": HUB_B, "receipts": receipts, "signature": sign_bytes(signed, key=_KEYS[HUB_B])}
    sealed = seal_for_hub(hub_key=hub_identity().public_key, payload=json.dumps(old).encode())

    assert _opened_here(sealed) == 0

    assert Delivery.objects.get(message_id=relayed_to_b).state == "relayed"
    [rejected] = AuditEvent.objects.filter(kind="federation.receipt_rejected")
    assert "destination" in rejected.detail["why"]


# --- handing a message to the relay ------------------------------------------------------------------


@pytest.fixture
def relay_http(monkeypatch) -> list[object]:
    """The relay (or the hub) as the transport meets it: each request gets the next answer, a
    (status, JSON body) signed by the key the request was made for, as a genuine relay or hub
    signs it, or an httpx exception to raise. Nothing leaves the process."""
    answers: list[object] = []

    @contextmanager
    def stream(method, url, **kw):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        raw = json.dumps(body).encode()
        headers = kw["headers"]
        signed = answer_signed(
            _ANSWERING[headers["X-Switchboard-Dest"]],
            method=method,
            url=url,
            headers=headers,
            content=kw["content"],
            status=status,
            body=raw,
        )
        yield httpx.Response(
            status,
            content=raw,
            headers={"Content-Type": "application/json", **signed},
            request=httpx.Request(method, url),
        )

    monkeypatch.setattr("federation.transport.httpx.stream", stream)
    return answers


REFUSALS = {
    "too_large": (
        413,
        {"error": "too_large", "detail": "The sealed message is larger than this relay keeps."},
    ),
    "relay_quota": (
        429,
        {
            "error": "relay_quota",
            "detail": "This hub key already keeps 2000 items waiting at the relay, as many as one key "
            "may; try again once its destinations have pulled them.",
        },
    ),
    "bad_request_signature": (
        401,
        {
            "error": "bad_request_signature",
            "detail": "This request was signed for another hub (X-Switchboard-Dest is not this hub's key).",
        },
    ),
    "not_found": (
        404,
        {"error": "not_found", "detail": "No hub has registered 'bob' with this relay; nothing is queued."},
    ),
    "bad_relay_message": (
        400,
        {
            "error": "invalid",
            "reason": "bad_relay_message",
            "detail": "message_id is a UUID and sealed is base64.",
        },
    ),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_message_the_relay_refuses_is_answered_failed_with_the_relays_reason(
    api, register, routes, relay_http, refusal, django_capture_on_commit_callbacks
):
    """Given the relay refuses what this hub hands it (too large, this hub's quota there, a bad
    request), when alice sends to bob behind the relay, then her answer is `failed`, saying why in
    the relay's words; the message stays here with that reason, and nothing is retried."""
    status, body = REFUSALS[refusal]
    alice = register("alice")
    routes.append(_route(tier="relay"))
    relay_http.append((status, body))

    sent = _send(api, alice, "bob", "over the relay", django_capture_on_commit_callbacks)

    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["status"] == "failed", sent.json_body
    assert "FAILED" in sent.json_body["result"] and body["detail"].rstrip(".") in sent.json_body["result"]
    [delivery] = api.get(f"messages/{sent.json_body['id']}", alice.token).json_body["deliveries"]
    assert delivery["state"] == "failed" and body["detail"].rstrip(".") in delivery["decision_reason"]
    assert delivery["remote"]["remote_state"] == "failed"
    assert RemoteDelivery.objects.get().next_attempt_at is None


# What a channel or LAN hub answers when it refuses a forward at once: an error, or a 201 whose
# delivery there is refused (its operator's policy).
HUB_REFUSALS = {
    "peer_revoked": (
        403,
        {"error": "peer_revoked", "detail": "An operator of this hub revoked the hub vm-alice."},
    ),
    "too_large": (413, {"error": "too_large", "detail": "That message is larger than this hub takes."}),
    "refused_by_policy": (
        201,
        {"message_id": "x", "status": "refused", "duplicate": False, "trust": "lan-verified"},
    ),
}


@pytest.fixture
def jobs_in_background(monkeypatch) -> list[tuple[str, tuple]]:
    """Background jobs as a hub runs them: on another thread or worker, after the sender is
    answered (here: recorded, never run), not inline at the commit as the test suite runs them."""
    import messaging.jobs

    started: list[tuple[str, tuple]] = []
    monkeypatch.setattr(messaging.jobs, "_submit", lambda name, args: started.append((name, args)))
    return started


@pytest.mark.parametrize("tier", ["channel", "lan"])
@pytest.mark.parametrize("refusal", sorted(HUB_REFUSALS))
def test_a_message_a_channel_or_lan_hub_refuses_at_once_is_answered_failed_with_its_reason(
    api, register, routes, relay_http, jobs_in_background, tier, refusal, django_capture_on_commit_callbacks
):
    """Given the hub that hosts bob (on this machine, or a LAN peer) refuses what this hub hands
    it, when alice sends to bob, then her answer is `failed` saying why, as a relay's refusal is
    (the same hand-over before the answer), not "handed to bob's hub"; nothing is retried."""
    status, body = HUB_REFUSALS[refusal]
    alice = register("alice")
    routes.append(_route(tier=tier))
    relay_http.append((status, body))

    sent = _send(api, alice, "bob", "across", django_capture_on_commit_callbacks)

    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["status"] == "failed", sent.json_body
    why = body.get("detail", "reports refused").rstrip(".")
    assert "FAILED" in sent.json_body["result"] and why in sent.json_body["result"]
    [delivery] = api.get(f"messages/{sent.json_body['id']}", alice.token).json_body["deliveries"]
    assert delivery["state"] == "failed" and why in delivery["decision_reason"]
    assert RemoteDelivery.objects.get().next_attempt_at is None
    assert relay_http == []  # one call: handed over once, on alice's thread


@pytest.mark.parametrize("tier", ["channel", "lan"])
def test_a_channel_or_lan_hub_that_takes_the_message_or_cannot_be_reached_is_answered_handed_over(
    api, register, routes, relay_http, jobs_in_background, tier, django_capture_on_commit_callbacks
):
    """Given the hub that hosts bob takes alice's first message (queued there) and cannot be
    reached for her second, then both answers say the message was handed to bob's hub and is not
    yet delivered; the second is retried with backoff."""
    alice = register("alice")
    routes.append(_route(tier=tier))
    relay_http.extend(
        [
            (201, {"message_id": "x", "status": "queued", "duplicate": False, "trust": "lan-verified"}),
            httpx.ConnectError("connection refused"),
        ]
    )

    taken = _send(api, alice, "bob", "first", django_capture_on_commit_callbacks)
    unreached = _send(api, alice, "bob", "second", django_capture_on_commit_callbacks)

    assert [taken.json_body["status"], unreached.json_body["status"]] == ["relayed", "relayed"]
    assert f"{tier} tier" in taken.json_body["result"]
    states = dict(RemoteDelivery.objects.values_list("message_id", "remote_state"))
    assert {str(k): v for k, v in states.items()} == {
        taken.json_body["id"]: "queued",
        unreached.json_body["id"]: "retry",
    }


@pytest.mark.parametrize("path", ["batch", "alone"])
def test_a_batch_or_a_send_outside_a_group_is_answered_what_the_relay_said(
    api, register, routes, relay_http, settings, path, django_capture_on_commit_callbacks
):
    """Given the relay refuses a message as too large, when alice sends it in a batch beside a
    local message, or alone with sends not grouped (SWITCHBOARD_SEND_TOGETHER=0), then its answer
    is `failed`; the local message is queued."""
    register("carol")
    alice = register("alice")
    routes.append(_route(tier="relay"))
    relay_http.append(REFUSALS["too_large"])
    with django_capture_on_commit_callbacks(execute=True):
        if path == "batch":
            body = {"messages": [{"to": "carol", "message": "here"}, {"to": "bob", "message": "there"}]}
            sent = api.post("messages/batch", alice.token, body)
            statuses = [r["status"] for r in sent.json_body["results"]]
        else:
            settings.SWITCHBOARD_SEND_TOGETHER = False
            statuses = [
                api.post("messages", alice.token, {"to": "bob", "message": "there"}).json_body["status"]
            ]
    assert statuses == (["queued", "failed"] if path == "batch" else ["failed"])


def test_a_relay_out_of_reach_is_retried_and_the_answer_says_it_is_not_delivered(
    api, register, routes, relay_http, django_capture_on_commit_callbacks
):
    """Given the relay cannot be reached, when alice sends to bob behind it, then her answer is
    `relayed` (not delivered, do not resend), the hand-over is retried with backoff, and the retry
    that reaches the relay leaves the message there."""
    alice = register("alice")
    routes.append(_route(tier="relay"))
    relay_http.append(httpx.ConnectError("connection refused"))

    sent = _send(api, alice, "bob", "later then", django_capture_on_commit_callbacks)

    assert sent.json_body["status"] == "relayed", sent.json_body
    assert "NOT yet delivered" in sent.json_body["result"]
    rd = RemoteDelivery.objects.get()
    assert (rd.remote_state, rd.attempts) == ("retry", 1) and rd.next_attempt_at is not None
    relay_http.append((201, {"id": "stored", "created": True}))
    forward_attempt(delivery_id=rd.delivery_id)
    assert RemoteDelivery.objects.get().remote_state == "at_relay"


def test_a_relay_out_of_reach_holds_a_batch_up_for_one_timeout_not_one_per_message(
    api, register, routes, relay_http, monkeypatch, django_capture_on_commit_callbacks
):
    """Given the relay cannot be reached, when alice sends three messages behind it in one batch,
    then her request tries the relay once: the other two go to the background job rather than
    each waiting out the same timeout before she is answered."""
    import messaging.jobs

    jobs: list[tuple[str, tuple]] = []
    monkeypatch.setattr(messaging.jobs, "_submit", lambda name, args: jobs.append((name, args)))
    alice = register("alice")
    names = ["bob", "bobby", "roberta"]
    routes.extend(
        RemoteRoute("relay", HUB_B, "hub-b", "http://relay.invalid", f"id-{name}", name, "bobref")
        for name in names
    )
    relay_http.extend(httpx.ConnectError("timed out") for _ in names)

    with django_capture_on_commit_callbacks(execute=True):
        body = {"messages": [{"to": name, "message": f"over the relay to {name}"} for name in names]}
        sent = api.post("messages/batch", alice.token, body)

    assert [r["status"] for r in sent.json_body["results"]] == ["relayed"] * 3, sent.json_body
    assert len(relay_http) == 2  # one request to the relay on alice's thread
    forwarded = [args[0] for name, args in jobs if name == "federation.tasks.forward_delivery"]
    waiting = RemoteDelivery.objects.filter(remote_state="pending").values_list("delivery_id", flat=True)
    assert sorted(forwarded) == sorted(waiting) and len(forwarded) == 2


def test_a_relayed_message_whose_hand_over_never_ran_is_carried_by_the_sweeper(
    api, register, routes, relay_http, monkeypatch, django_capture_on_commit_callbacks
):
    """Given alice's message to bob behind the relay was committed but never handed over (its
    process stopped right after the commit), when the forward sweeper runs a minute later, then it
    carries the message to the relay; before then it leaves it alone."""
    from datetime import timedelta

    from federation.services.forwarding import forwards_due
    from messaging.plugins import PLUGINS

    monkeypatch.setattr(PLUGINS.other_hubs, "hand_over", lambda **kw: None)
    alice = register("alice")
    routes.append(_route(tier="relay"))

    _send(api, alice, "bob", "still here?", django_capture_on_commit_callbacks)

    rd = RemoteDelivery.objects.get()
    assert rd.remote_state == "pending"
    assert forwards_due() == []
    assert forwards_due(now=timezone.now() + timedelta(minutes=2)) == [rd.delivery_id]
    relay_http.append((201, {"id": "stored", "created": True}))
    forward_attempt(delivery_id=rd.delivery_id)
    assert RemoteDelivery.objects.get().remote_state == "at_relay"


def test_a_released_hold_whose_forward_job_was_lost_is_carried_by_the_sweeper(
    api, register, routes, hubs, settings, monkeypatch, django_capture_on_commit_callbacks
):
    """Given alice's message to bob on another hub held for an operator (isolation), when the
    operator approves it and the job that would carry it is lost (the broker went away), then the
    forward sweeper carries it a minute later; before then it leaves it alone."""
    from datetime import timedelta

    import messaging.jobs
    from federation.services.forwarding import forwards_due
    from messaging.principals import operator_principal
    from messaging.services.holds import holds_decide

    alice = register("alice")
    routes.append(_route(tier="lan"))
    settings.SWITCHBOARD_ISOLATED = True
    sent = _send(api, alice, "bob", "leaving?", django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(message_id=sent.json_body["id"])
    assert delivery.state == "held"
    monkeypatch.setattr(messaging.jobs, "_submit", lambda *args: None)  # the job never runs

    with django_capture_on_commit_callbacks(execute=True):
        holds_decide(delivery_ids=[delivery.pk], approve=True, actor=operator_principal("op"))

    assert hubs.calls == [] and RemoteDelivery.objects.get().remote_state == "pending"
    assert forwards_due() == []
    assert forwards_due(now=timezone.now() + timedelta(minutes=2)) == [delivery.pk]
    forward_attempt(delivery_id=delivery.pk)
    assert len(hubs.calls) == 1
    assert RemoteDelivery.objects.get().remote_state == "queued"


def test_a_failure_the_other_hub_reports_is_the_senders_to_read_with_its_reason(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    alice = register("alice")
    routes.append(_route())
    sent = _send(api, alice, "bob", "did it arrive?", django_capture_on_commit_callbacks)
    message_id = sent.json_body["id"]
    receipt = {"message_id": message_id, "state": "failed", "reason": "bob's socket refused it"}

    assert receipts_from_hub(hub_key=HUB_B, receipts=[receipt]) == 1

    status = api.get(f"messages/{message_id}", alice.token).json_body
    assert status["status"] == "failed"
    [delivery] = status["deliveries"]
    assert "bob's socket refused it" in delivery["decision_reason"]


def test_a_send_the_relay_did_not_know_and_another_hub_took_is_answered_as_that_hub_took_it(
    api, register, routes, hubs, django_capture_on_commit_callbacks
):
    """Given bob leased at the relay and hosted on a LAN hub too, when the relay says it knows no
    bob while alice's send is handed over, then the send goes to the LAN hub, and her answer names
    that hub's tier and stand-in, not the relay's."""
    alice = register("alice")
    routes.extend([_route("relay", HUB_C), _route("lan", HUB_B)])
    hubs.answers = [PermanentError(404, {"error": "not_found"}), {"status": "queued"}]

    sent = _send(api, alice, "bob", "which way?", django_capture_on_commit_callbacks)

    assert sent.status_code == 201, sent.json_body
    delivery = Delivery.objects.select_related("recipient").get(message_id=sent.json_body["id"])
    assert delivery.tier == "lan"
    assert sent.json_body["status"] == "relayed"
    assert "through the relay" not in sent.json_body["result"] and "lan tier" in sent.json_body["result"]
