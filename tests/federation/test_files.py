"""Files on the host tier: upload, attach, limits, and copying only when the message is handed over."""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.core.files.uploadedfile import SimpleUploadedFile


def _upload(api, token, data: bytes, name: str = "notes.txt"):
    response = api.client.post(
        "/api/v1/files", {"file": SimpleUploadedFile(name, data)}, HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_an_upload_is_stored_once_under_its_sha256(api, register, settings):
    alice = register("alice")
    first = _upload(api, alice.token, b"same bytes", "a.txt")
    second = _upload(api, alice.token, b"same bytes", "b.txt")
    assert first == second == {"sha256": hashlib.sha256(b"same bytes").hexdigest(), "size": 10}
    stored = list((settings.SWITCHBOARD_FILES_DIR / "store").rglob("*"))
    assert [p.name for p in stored if p.is_file()] == [first["sha256"]]


def test_files_reach_the_recipients_folder_only_when_handed_over(api, register, settings):
    alice, bob = register("alice"), register("bob")
    sha = _upload(api, alice.token, b"report body", "/home/alice/secret/report.md")["sha256"]
    api.patch("sessions/me", bob.token, {"status": "stopped"})
    sent = api.post(
        "messages",
        alice.token,
        {
            "to": "bob",
            "message": "see file",
            "files": [{"sha256": sha, "name": "/home/alice/secret/report.md"}],
        },
    )
    assert sent.json_body["status"] == "held"
    assert not (settings.SWITCHBOARD_FILES_DIR / "sessions").exists()
    api.patch("sessions/me", bob.token, {"status": "idle"})
    [frame] = api.get("inbox", bob.token).json_body["messages"]
    [listed] = frame["files"]
    path = Path(listed["path"])
    assert path.read_bytes() == b"report body"
    assert path.name.endswith(".md") and "secret" not in str(path) and bob.id in str(path)
    assert "FILES=1" in frame["marker"] and str(path) in frame["framed"]


def test_more_than_ten_files_or_an_unknown_hash_is_refused(api, register):
    alice, _ = register("alice"), register("bob")
    sha = _upload(api, alice.token, b"x")["sha256"]
    eleven = api.post(
        "messages", alice.token, {"to": "bob", "message": "many", "files": [{"sha256": sha}] * 11}
    )
    assert eleven.status_code == 400 and eleven.json_body["reason"] == "too_many_files"
    unknown = api.post(
        "messages", alice.token, {"to": "bob", "message": "ghost", "files": [{"sha256": "0" * 64}]}
    )
    assert unknown.status_code == 404


def test_a_session_token_is_needed_to_upload(api, operator_token):
    response = api.client.post(
        "/api/v1/files",
        {"file": SimpleUploadedFile("x", b"x")},
        HTTP_AUTHORIZATION=f"Bearer {operator_token}",
    )
    assert response.status_code == 403


def test_a_session_attaches_only_files_it_uploaded_or_was_handed(api, register):
    """Knowing a stored file's SHA-256 (from a log, or by hashing a few likely contents) is not
    holding the file: another session's file is refused exactly as an unknown one, so the answer
    does not tell whether the hub stores it either. A file handed over in a message may be passed on."""
    alice, bob, eve, carol = register("alice"), register("bob"), register("eve"), register("carol")
    sha = _upload(api, alice.token, b"PIN=4821")["sha256"]

    def send(sender, to, sha256):
        return api.post(
            "messages", sender.token, {"to": to, "message": "a file", "files": [{"sha256": sha256}]}
        )

    stolen, unknown = send(eve, "carol", sha), send(eve, "carol", "0" * 64)
    assert stolen.status_code == unknown.status_code == 404
    assert stolen.json_body["detail"].replace(sha, "H") == unknown.json_body["detail"].replace("0" * 64, "H")
    assert api.get("inbox", carol.token).json_body["messages"] == []

    assert send(alice, "bob", sha).status_code == 201
    assert send(bob, "carol", sha).status_code == 404  # sent to bob, not yet handed over
    [frame] = api.get("inbox", bob.token).json_body["messages"]
    assert frame["files"][0]["sha256"] == sha
    assert send(bob, "carol", sha).status_code == 201
    [passed_on] = api.get("inbox", carol.token).json_body["messages"]
    assert Path(passed_on["files"][0]["path"]).read_bytes() == b"PIN=4821"
