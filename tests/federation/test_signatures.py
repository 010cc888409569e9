"""Hub identity and signatures: the key file, message signatures, request signatures."""

from __future__ import annotations

import stat

from federation.services.identity import hub_identity
from federation.services.signatures import (
    envelope_sign,
    envelope_verify,
    request_headers,
    request_verify,
)


def test_hub_key_is_created_once_with_mode_0600(settings):
    first = hub_identity()
    path = settings.SWITCHBOARD_HOME / "hub.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert hub_identity().public_key == first.public_key


def _envelope(**changes):
    me = hub_identity()
    envelope = {
        "id": "6f1c2a86-3b3e-4a43-8d2c-4f5f2a9f0e11",
        "from": {"hub": me.public_key, "id": "s1", "name": "alice"},
        "to": "bob",
        "text": "hello",
        "files": [{"sha256": "a" * 64}],
    }
    signed = envelope_sign(envelope)
    signed.update(changes)
    return signed


def test_a_signed_envelope_verifies():
    assert envelope_verify(_envelope())


def test_changing_text_recipient_sender_or_file_hash_breaks_the_signature():
    assert not envelope_verify(_envelope(text="hello!"))
    assert not envelope_verify(_envelope(to="carol"))
    assert not envelope_verify(
        _envelope(**{"from": {"hub": hub_identity().public_key, "id": "s1", "name": "mallory"}})
    )
    assert not envelope_verify(_envelope(files=[{"sha256": "b" * 64}]))


def test_a_signature_by_another_key_does_not_verify(other_hub):
    envelope = _envelope()
    envelope["from"] = dict(envelope["from"], hub=other_hub.public_key)
    assert not envelope_verify(envelope)


def test_request_signature_covers_method_path_and_body():
    headers = request_headers(method="POST", path="/api/v1/x?a=1", body=b"{}")
    me = hub_identity().public_key
    assert request_verify(method="POST", path="/api/v1/x?a=1", body=b"{}", headers=headers) == me
    assert request_verify(method="POST", path="/api/v1/x?a=2", body=b"{}", headers=headers) is None
    assert request_verify(method="POST", path="/api/v1/x?a=1", body=b"{1}", headers=headers) is None
    assert request_verify(method="GET", path="/api/v1/x?a=1", body=b"{}", headers=headers) is None


def test_a_stale_request_signature_is_refused():
    import time

    headers = request_headers(method="GET", path="/p", body=b"")
    assert request_verify(method="GET", path="/p", body=b"", headers=headers, now=time.time() + 3600) is None
