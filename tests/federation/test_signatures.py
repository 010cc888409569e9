"""Hub identity and signatures: the key file, message signatures (bound to the destination hub),
request signatures."""

from __future__ import annotations

import stat

import pytest

from federation.errors import BadRequestSignature, ReplayedRequest
from federation.services.identity import hub_identity
from federation.services.signatures import (
    REQUEST_SKEW_SECONDS,
    envelope_sign,
    envelope_verify,
    nonces_prune,
    request_accept,
    request_headers,
    request_precheck,
    request_verify,
)


def test_hub_key_is_created_once_with_mode_0600(settings):
    first = hub_identity()
    path = settings.SWITCHBOARD_HOME / "hub.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert hub_identity().public_key == first.public_key


DEST = "ZGVzdGluYXRpb24taHViLWtleS0zMi1ieXRlcy1sb25nIQ=="  # the hub the envelope is made for


def _envelope(**changes):
    me = hub_identity()
    envelope = {
        "id": "6f1c2a86-3b3e-4a43-8d2c-4f5f2a9f0e11",
        "from": {"hub": me.public_key, "id": "s1", "name": "alice"},
        "to": "bob",
        "dest": DEST,
        "text": "hello",
        "files": [{"sha256": "a" * 64}],
    }
    signed = envelope_sign(envelope)
    signed.update(changes)
    return signed


def test_a_signed_envelope_verifies_for_the_hub_it_was_made_for():
    assert envelope_verify(_envelope(), dest_key=DEST)


def test_changing_text_recipient_sender_or_file_hash_breaks_the_signature():
    assert not envelope_verify(_envelope(text="hello!"), dest_key=DEST)
    assert not envelope_verify(_envelope(to="carol"), dest_key=DEST)
    assert not envelope_verify(
        _envelope(**{"from": {"hub": hub_identity().public_key, "id": "s1", "name": "mallory"}}),
        dest_key=DEST,
    )
    assert not envelope_verify(_envelope(files=[{"sha256": "b" * 64}]), dest_key=DEST)


def test_an_envelope_made_for_another_hub_does_not_verify_here_even_readdressed(other_hub):
    """The destination hub's key is signed: checked for another key it fails, and rewriting
    `dest` to that key breaks the signature."""
    assert not envelope_verify(_envelope(), dest_key=other_hub.public_key)
    assert not envelope_verify(_envelope(dest=other_hub.public_key), dest_key=other_hub.public_key)


def test_an_envelope_of_the_previous_version_without_a_destination_does_not_verify():
    """Version 2 signed no destination, so it could be replayed to any hub: never verified."""
    import hashlib

    from federation.services.signatures import _canonical, sign_bytes

    envelope = _envelope()
    del envelope["dest"]
    fields = {
        "v": 2,
        "id": envelope["id"],
        "from": {k: envelope["from"].get(k) for k in ("hub", "hub_name", "url", "id", "name", "ref")},
        "to": envelope["to"],
        "sha256": hashlib.sha256(envelope["text"].encode()).hexdigest(),
        "summary": None,
        "priority": None,
        "kind": None,
        "created_at": None,
        "files": [["a" * 64, None]],
    }
    envelope.update(v=2, signature=sign_bytes(_canonical(fields)))
    assert not envelope_verify(envelope, dest_key=DEST)
    assert not envelope_verify(envelope, dest_key="")


def test_a_signature_by_another_key_does_not_verify(other_hub):
    envelope = _envelope()
    envelope["from"] = dict(envelope["from"], hub=other_hub.public_key)
    assert not envelope_verify(envelope, dest_key=DEST)


def _claim(headers, **kw):
    return request_precheck(headers=headers, **kw)


def test_request_signature_covers_method_path_and_body(db):
    me = hub_identity().public_key
    headers = request_headers(method="POST", path="/api/v1/x?a=1", body=b"{}", dest_key=me)
    claim = _claim(headers)
    assert request_verify(method="POST", path="/api/v1/x?a=1", body=b"{}", claim=claim)
    assert not request_verify(method="POST", path="/api/v1/x?a=2", body=b"{}", claim=claim)
    assert not request_verify(method="POST", path="/api/v1/x?a=1", body=b"{1}", claim=claim)
    assert not request_verify(method="GET", path="/api/v1/x?a=1", body=b"{}", claim=claim)


def test_a_stale_request_signature_is_refused(db):
    import time

    headers = request_headers(method="GET", path="/p", body=b"", dest_key=hub_identity().public_key)
    with pytest.raises(BadRequestSignature):
        _claim(headers, now=time.time() + 3600)


def test_a_request_is_accepted_once(db):
    headers = request_headers(method="GET", path="/p", body=b"", dest_key=hub_identity().public_key)
    assert request_accept(method="GET", path="/p", body=b"", claim=_claim(headers))
    with pytest.raises(ReplayedRequest):
        _claim(headers)


def test_old_nonces_are_pruned(db):
    from datetime import timedelta

    from django.utils import timezone

    from federation.models import RequestNonce

    headers = request_headers(method="GET", path="/p", body=b"", dest_key=hub_identity().public_key)
    request_accept(method="GET", path="/p", body=b"", claim=_claim(headers))
    assert nonces_prune(now=timezone.now()) == 0
    assert nonces_prune(now=timezone.now() + timedelta(seconds=REQUEST_SKEW_SECONDS + 2)) == 1
    assert not RequestNonce.objects.exists()
