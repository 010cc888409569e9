"""Hub identity and signatures: the key file, message signatures (bound to the destination hub),
request signatures."""

from __future__ import annotations

import hashlib
import stat

import pytest

from federation.errors import BadRequestSignature, ReplayedRequest
from federation.services.identity import hub_identity
from federation.services.signatures import (
    REQUEST_SKEW_SECONDS,
    HubRequest,
    envelope_sign,
    envelope_verify,
    nonces_prune,
    request_accept,
    request_precheck,
    request_sign,
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


def _received(headers, *, method="GET", path="/p", body=b""):
    """The request as it reached this hub, its body read whole."""
    return HubRequest(
        method=method, path=path, claim=_claim(headers), body_sha256=hashlib.sha256(body).hexdigest()
    )


def test_request_signature_covers_method_path_and_body(db):
    me = hub_identity().public_key
    headers = request_sign(method="POST", path="/api/v1/x?a=1", body=b"{}", dest_key=me).claim.headers()
    claim = _claim(headers)
    assert request_verify(method="POST", path="/api/v1/x?a=1", body=b"{}", claim=claim)
    assert not request_verify(method="POST", path="/api/v1/x?a=2", body=b"{}", claim=claim)
    assert not request_verify(method="POST", path="/api/v1/x?a=1", body=b"{1}", claim=claim)
    assert not request_verify(method="GET", path="/api/v1/x?a=1", body=b"{}", claim=claim)


def test_a_stale_request_signature_is_refused(db):
    import time

    headers = request_sign(
        method="GET", path="/p", body=b"", dest_key=hub_identity().public_key
    ).claim.headers()
    with pytest.raises(BadRequestSignature):
        _claim(headers, now=time.time() + 3600)


def test_a_request_is_accepted_once(db):
    headers = request_sign(
        method="GET", path="/p", body=b"", dest_key=hub_identity().public_key
    ).claim.headers()
    assert request_accept(_received(headers))
    with pytest.raises(ReplayedRequest):
        _claim(headers)


def test_old_nonces_are_pruned(db):
    from datetime import timedelta

    from django.utils import timezone

    from federation.models import RequestNonce

    headers = request_sign(
        method="GET", path="/p", body=b"", dest_key=hub_identity().public_key
    ).claim.headers()
    request_accept(_received(headers))
    assert nonces_prune(now=timezone.now()) == 0
    assert nonces_prune(now=timezone.now() + timedelta(seconds=REQUEST_SKEW_SECONDS + 2)) == 1
    assert not RequestNonce.objects.exists()


# --- answers -------------------------------------------------------------------------------------


def _answer_check(request, *, status, body, headers, dest_key=None):
    from federation.services.signatures import answer_problem

    return answer_problem(
        request, status=status, body=body, headers=headers, dest_key=dest_key or hub_identity().public_key
    )


def test_an_answer_counts_only_from_the_hub_called_for_the_request_it_answers(other_hub):
    """Given another hub's request to this hub and this hub's signed answer to it, then the answer
    checks out for that request, and not once its status or body changed, for another request,
    unsigned, in a version nobody signs, or checked against another hub's key."""
    from federation.services.signatures import ANSWER_VERSION_HEADER, answer_headers

    me = hub_identity().public_key
    sent = request_sign(
        method="POST", path="/api/v1/federation/messages", body=b"{}", dest_key=me, key=other_hub.key
    )
    body = b'{"status": "queued"}'
    headers = answer_headers(sent, status=201, body=body)

    assert _answer_check(sent, status=201, body=body, headers=headers) is None
    assert "does not verify" in _answer_check(sent, status=201, body=b'{"status": "read"}', headers=headers)
    assert "does not verify" in _answer_check(sent, status=403, body=body, headers=headers)
    another = request_sign(
        method="POST", path="/api/v1/federation/messages", body=b"{}", dest_key=me, key=other_hub.key
    )
    assert _answer_check(another, status=201, body=body, headers=headers) == "the answer to another request"
    assert _answer_check(sent, status=201, body=body, headers={}) == "unsigned"
    older = {**headers, ANSWER_VERSION_HEADER: "switchboard-answer-0"}
    assert "format" in _answer_check(sent, status=201, body=body, headers=older)
    signed_elsewhere = _answer_check(
        sent, status=201, body=body, headers=headers, dest_key=other_hub.public_key
    )
    assert "another hub key" in signed_elsewhere


@pytest.mark.parametrize(
    ("status", "counts"), [(401, True), (403, True), (503, True), (200, False), (201, False)]
)
def test_an_answer_made_before_the_body_was_read_counts_for_an_error_only(other_hub, status, counts):
    """Given this hub answered a request from its headers alone (refused before its body was read),
    then the answer counts for an error, and never for a 2xx, which takes the body verified."""
    from dataclasses import replace

    from federation.services.signatures import BODY_NOT_READ, answer_headers

    me = hub_identity().public_key
    sent = request_sign(
        method="POST", path="/api/v1/federation/receipts", body=b"{}", dest_key=me, key=other_hub.key
    )
    headers = answer_headers(replace(sent, body_sha256=BODY_NOT_READ), status=status, body=b"{}")

    assert (_answer_check(sent, status=status, body=b"{}", headers=headers) is None) is counts
