"""The console's peers page: peer hubs listed with their key and standing, and an operator's pin,
revoke (refuse or hold) and restore going through `federation.services.peers` and the audit log."""

from __future__ import annotations

import base64

import pytest
from django.test import Client
from nacl.signing import SigningKey

from federation.errors import PeerRevoked
from federation.models import Peer
from federation.services.identity import key_fingerprint
from federation.services.peers import peer_seen
from messaging.models import AuditEvent
from tests.console.conftest import csrf_post

SCRIPT = "<script>alert('pwned')</script>"


def _new_key() -> str:
    return base64.b64encode(bytes(SigningKey.generate().verify_key)).decode("ascii")


@pytest.fixture
def peer(db, settings) -> Peer:
    """A hub recorded on first use (not pinned), with a hostile name and URL."""
    settings.SWITCHBOARD_PEER_TOFU = True
    standing = peer_seen(public_key=_new_key(), name=f"evil {SCRIPT}", url=f"http://x/{SCRIPT}", tier="lan")
    return standing.peer


def _audited(kind: str, peer: Peer) -> AuditEvent:
    event = AuditEvent.objects.filter(kind=kind, target=peer.public_key).order_by("-id").first()
    assert event is not None, kind
    return event


def test_the_peers_page_needs_a_login(db):
    response = Client().get("/peers/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_a_user_who_is_not_an_operator_sees_no_peers_and_changes_none(visitor_client, peer):
    assert visitor_client.get("/peers/").status_code == 302
    for action, data in [("pin", {}), ("revoke", {"mode": "refuse"}), ("restore", {})]:
        response = csrf_post(visitor_client, f"/peers/{peer.pk}/{action}", data)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")
    response = csrf_post(visitor_client, "/peers/pin", {"public_key": _new_key(), "tier": "lan"})
    assert response["Location"].startswith("/login/")
    peer.refresh_from_db()
    assert (peer.pinned, peer.revoked) == (False, False)
    assert Peer.objects.count() == 1


def test_a_post_without_the_csrf_token_is_refused(operator_client, peer):
    response = operator_client.post(f"/peers/{peer.pk}/revoke", {"mode": "refuse"})
    assert response.status_code == 403
    peer.refresh_from_db()
    assert not peer.revoked


def test_the_page_lists_a_peer_with_its_facts_and_escapes_its_name_and_url(operator_client, peer):
    page = operator_client.get("/peers/")
    assert page.status_code == 200
    assert "script-src 'self'" in page["Content-Security-Policy"]
    html = page.content.decode()
    assert SCRIPT not in html
    assert "evil &lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    assert "http://x/&lt;script&gt;" in html
    assert key_fingerprint(peer.public_key) in html
    assert peer.public_key in html
    assert 'data-trust="first-use"' in html
    assert 'aria-current="page"' in html and 'href="/peers/"' in html


def test_pin_a_peer_first_seen_keeps_its_details_and_is_audited(operator_client, peer):
    response = csrf_post(operator_client, f"/peers/{peer.pk}/pin", {})
    assert response.status_code == 302 and response["Location"] == "/peers/"
    peer.refresh_from_db()
    assert peer.pinned
    assert (peer.name, peer.tier) == (f"evil {SCRIPT}", "lan")
    assert _audited("peer.pinned", peer).actor.endswith("op")
    assert 'data-trust="pinned"' in operator_client.get("/peers/").content.decode()


def test_pin_a_new_key_typed_in_by_the_operator(operator_client, db):
    key = _new_key()
    response = csrf_post(
        operator_client,
        "/peers/pin",
        {"public_key": key, "name": "lab", "url": "http://lab:8700/", "tier": "lan"},
    )
    assert response.status_code == 302
    peer = Peer.objects.get(public_key=key)
    assert (peer.pinned, peer.name, peer.url) == (True, "lab", "http://lab:8700")
    assert _audited("peer.pinned", peer).detail["created"] is True


def test_a_bad_key_is_refused_with_a_message_and_nothing_is_pinned(operator_client, db):
    response = csrf_post(operator_client, "/peers/pin", {"public_key": "not-a-key", "tier": "lan"})
    assert response.status_code == 302
    assert not Peer.objects.exists()
    page = operator_client.get("/peers/").content.decode()
    assert "base64 Ed25519" in page


@pytest.mark.parametrize("mode", ["refuse", "hold"])
def test_revoke_in_either_mode_then_restore(operator_client, peer, mode):
    response = csrf_post(operator_client, f"/peers/{peer.pk}/revoke", {"mode": mode})
    assert response.status_code == 302
    peer.refresh_from_db()
    assert (peer.revoked, peer.revocation_mode) == (True, mode)
    assert _audited("peer.revoked", peer).detail == {"mode": mode}

    # The service now treats the hub as the operator chose.
    if mode == "hold":
        assert peer_seen(public_key=peer.public_key, tier="lan").hold is True
    else:
        with pytest.raises(PeerRevoked):
            peer_seen(public_key=peer.public_key, tier="lan")
    html = operator_client.get("/peers/").content.decode()
    assert f'data-revoked="{mode}"' in html
    assert f"/peers/{peer.pk}/restore" in html

    response = csrf_post(operator_client, f"/peers/{peer.pk}/restore", {})
    assert response.status_code == 302
    peer.refresh_from_db()
    assert (peer.revoked, peer.revocation_mode) == (False, "refuse")
    assert _audited("peer.restored", peer)
    assert peer_seen(public_key=peer.public_key, tier="lan").hold is False


def test_an_unknown_revocation_mode_changes_nothing(operator_client, peer):
    response = csrf_post(operator_client, f"/peers/{peer.pk}/revoke", {"mode": "ignore"})
    assert response.status_code == 302
    peer.refresh_from_db()
    assert not peer.revoked
    assert not AuditEvent.objects.filter(kind="peer.revoked").exists()


def test_actions_on_an_unknown_peer(operator_client, db):
    assert csrf_post(operator_client, "/peers/999/pin", {}).status_code == 404
    response = csrf_post(operator_client, "/peers/999/revoke", {"mode": "refuse"})
    assert response.status_code == 302
    assert "No peer hub" in operator_client.get("/peers/").content.decode()


def test_a_key_nothing_was_sealed_to_is_listed_until_an_operator_pins_it(operator_client, db):
    """The relay named a key no operator pinned (a lapsed lease taken by another hub)."""
    key = _new_key()
    AuditEvent.objects.create(
        kind="federation.key_unverified",
        actor="hub",
        target=key,
        detail={"tier": "relay", "url": "http://relay", "agent": f"bob{SCRIPT}"},
    )
    page = operator_client.get("/peers/").content.decode()
    assert key_fingerprint(key) in page and "Keys nothing was sent to" in page
    assert SCRIPT not in page
    csrf_post(operator_client, "/peers/pin", {"public_key": key, "tier": "relay"})
    assert Peer.objects.get(public_key=key).pinned
    assert "Keys nothing was sent to" not in operator_client.get("/peers/").content.decode()


def test_a_flood_of_first_seen_keys_never_pushes_a_pinned_or_revoked_hub_off_the_page(operator_client, db):
    """Given a hub an operator pinned and one it revoked, both last seen long ago, when a thousand
    home-made keys call afterwards (each recorded on first use), then the peers page still lists
    the pinned and the revoked hub, with their buttons: an operator's decisions stay in reach."""
    from datetime import timedelta

    from django.utils import timezone

    long_ago = timezone.now() - timedelta(days=30)
    pinned = Peer.objects.create(public_key=_new_key(), name="trusted-hub", pinned=True, last_seen=long_ago)
    revoked = Peer.objects.create(public_key=_new_key(), name="banned-hub", revoked=True, last_seen=long_ago)
    Peer.objects.bulk_create(
        Peer(public_key=f"flood-{i:04d}", name=f"stranger-{i}", last_seen=timezone.now()) for i in range(1000)
    )

    page = operator_client.get("/peers/").content.decode()

    assert "trusted-hub" in page and "banned-hub" in page
    assert f"/peers/{pinned.pk}/revoke" in page and f"/peers/{revoked.pk}/restore" in page
