"""The sensitive tier: every part of a message is scanned (text, summary, a frame's JSON, attached
files, and the same from other hubs), a matched secret is never shown to an operator by default
(REST holds, live events, the feed, the audit, the message page), revealing it is audited, and an
escalated hold is approved only with a reason. Secrets here are fake, made at run time."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from nacl.signing import SigningKey

from hub_fixtures.sensitivity_corpus import AWS_SECRET, GH, PEM_RSA, PW
from messaging.models import AuditEvent, Message, MessageKind
from tests.console.conftest import csrf_post, operator_client  # noqa: F401 (a fixture)

SECRET_TEXT = f"deploy key ready: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} then run it"


def _held(api: Any, operator_token: str) -> dict[str, Any]:
    [hold] = api.get("holds", operator_token).json_body["holds"]
    return hold


def _all_audit_text() -> str:
    return json.dumps([[e.kind, e.actor, e.target, e.detail] for e in AuditEvent.objects.all()])


# --- what is scanned --------------------------------------------------------------------------


def test_a_token_in_the_summary_alone_is_held(api, register, send, operator_token):
    alice, _bob = register("alice"), register("bob")
    sent = send(alice, "bob", "status update, nothing else", summary=f"token {GH}")
    assert (sent.json_body["status"], sent.json_body["tier"]) == ("held", "sensitive")
    hold = _held(api, operator_token)
    assert hold["matched"] == ["GitHub token (in the summary)"]
    assert GH not in json.dumps(hold) and "[GitHub token ghp_…" in hold["summary"]


def test_a_frame_is_scanned_as_its_json(db):
    from messaging.services.pipeline import message_send
    from messaging.services.request import SendRequest
    from messaging.services.sessions import session_register

    alice, _bob = session_register(name="alice").session, session_register(name="bob").session
    frame = json.dumps({"type": "task_completed", "result": "done", "db": {"password": PW}})
    sent = message_send(
        SendRequest(sender=alice, to="bob", text=frame, kind=MessageKind.FRAME, frame_type="task_completed")
    )
    assert (sent.delivery.state, sent.message.tier, sent.message.matched) == (
        "held",
        "sensitive",
        "secret_assignment",
    )


def test_a_private_key_in_an_attached_file_is_held(api, register, operator_token, settings, tmp_path):
    settings.SWITCHBOARD_FILES_DIR = tmp_path / "files"
    alice, _bob = register("alice"), register("bob")
    uploaded = api.client.post(
        "/api/v1/files",
        {"file": SimpleUploadedFile("deploy.pem", PEM_RSA.encode())},
        HTTP_AUTHORIZATION=f"Bearer {alice.token}",
    )
    assert uploaded.status_code == 201, uploaded.content
    sha = uploaded.json()["sha256"]
    sent = api.post(
        "messages", alice.token, {"to": "bob", "message": "see the attached file", "files": [{"sha256": sha}]}
    )
    assert (sent.json_body["status"], sent.json_body["tier"]) == ("held", "sensitive")
    assert _held(api, operator_token)["matched"] == ["private key block (in the file)"]


def test_a_binary_file_is_not_read_as_text(db):
    from messaging.sensitivity import classify

    assert classify("see file", files=[b"\x00\x01" + PW.encode()]).tier == "info"
    assert classify("see file", files=[f"password: {PW}\n".encode()]).tier == "sensitive"


def test_summary_and_files_from_another_hub_are_scanned(api, register, operator_token, settings, tmp_path):
    from tests.federation.conftest import OtherHub

    settings.SWITCHBOARD_FILES_DIR = tmp_path / "files"
    settings.SWITCHBOARD_REGISTRY_DIR = tmp_path / "registry"
    register("bob")
    hub = OtherHub(SigningKey.generate())
    data = PEM_RSA.encode()
    file = {
        "name": "id_rsa",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "data": base64.b64encode(data).decode(),
    }
    for extra, matched in (
        ({"summary": f"token {GH}"}, "github_token@summary"),
        ({"files": [file]}, "private_key_block@file"),
    ):
        envelope = hub.envelope(to="bob", text="a plain note from afar", **extra)
        sent = hub.call(
            api.client, "POST", "/api/v1/federation/messages", {"tier": "lan", "envelope": envelope}
        )
        assert sent.status_code == 201, sent.json_body
        assert sent.json_body["status"] == "held", extra
        message = Message.objects.get(pk=sent.json_body["message_id"])
        assert (message.tier, message.matched) == ("sensitive", matched)
        assert message.deliveries.get().escalate == "required"


# --- never shown by default -------------------------------------------------------------------


def test_rest_holds_and_the_audit_show_the_secret_masked(api, register, send, operator_token):
    alice, _bob = register("alice"), register("bob")
    send(alice, "bob", SECRET_TEXT)
    hold = _held(api, operator_token)
    assert AWS_SECRET not in json.dumps(hold)
    assert f"[AWS secret access key {AWS_SECRET[:4]}…{AWS_SECRET[-4:]}]" in hold["preview"]
    assert hold["matched"] == ["AWS secret access key"]
    assert AWS_SECRET not in _all_audit_text()
    held = AuditEvent.objects.get(kind="delivery.held")
    assert held.detail["matched"] == [f"AWS secret access key {AWS_SECRET[:4]}…{AWS_SECRET[-4:]}"]
    audit = api.get("audit", operator_token)
    assert audit.status_code == 200 and AWS_SECRET not in json.dumps(audit.json_body)


def test_the_live_event_and_the_feed_show_the_secret_masked(api, register, send, monkeypatch):
    import messaging.services.transports as transports
    from console.selectors import feed_rows

    announced: list[Any] = []
    monkeypatch.setattr(transports, "announce_many", lambda items: announced.extend(items))
    alice, _bob = register("alice"), register("bob")
    send(alice, "bob", SECRET_TEXT, summary=f"with {GH}")
    [event] = [a for a in announced if a.kind == "message.sent"]
    assert event.operators  # the console's operators group gets it
    payload = json.dumps(event.data)
    assert AWS_SECRET not in payload and GH not in payload
    assert "[AWS secret access key" in event.data["preview"] and "[GitHub token" in event.data["summary"]
    assert event.data["matched"] == ["AWS secret access key", "GitHub token (in the summary)"]
    assert AWS_SECRET not in json.dumps(feed_rows()) and GH not in json.dumps(feed_rows())


def test_the_message_page_masks_and_a_reveal_is_audited(api, register, send, operator_client):  # noqa: F811
    alice, _bob = register("alice"), register("bob")
    message_id = send(alice, "bob", SECRET_TEXT).json_body["id"]
    page = operator_client.get(f"/messages/{message_id}/").content.decode()
    assert AWS_SECRET not in page and "AWS secret access key" in page and "data-reveal" in page
    holds_page = operator_client.get("/holds/").content.decode()
    assert AWS_SECRET not in holds_page and "sensitive: AWS secret access key" in holds_page
    assert not AuditEvent.objects.filter(kind="message.revealed").exists()

    revealed = csrf_post(operator_client, f"/messages/{message_id}/reveal", {})
    assert revealed.status_code == 200 and AWS_SECRET in revealed.content.decode()
    event = AuditEvent.objects.get(kind="message.revealed")
    assert (event.actor, event.target, str(event.message_id)) == ("operator:op", message_id, message_id)
    assert AWS_SECRET not in _all_audit_text()


def test_the_django_admin_shows_a_sensitive_message_masked_and_cannot_be_searched_for_it(register, send, db):
    """Given a sensitive message (a secret in its text and one in its summary) and a plain one,
    when a staff user opens the Django admin's message, delivery and audit pages, filters on the
    text or searches the summary, then neither secret is shown or confirmed; the text is masked
    as on the console, which the page points to for the audited reveal."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    alice, _bob = register("alice"), register("bob")
    secret_id = send(alice, "bob", SECRET_TEXT, summary=f"with {GH}").json_body["id"]
    plain_id = send(alice, "bob", "lunch at noon?", summary="a plain note").json_body["id"]
    staff = get_user_model().objects.create_superuser("root", password="root-password-1")
    admin = Client()
    admin.force_login(staff)

    page = admin.get(f"/admin/messaging/message/{secret_id}/change/")
    assert page.status_code == 200
    shown = page.content.decode()
    assert AWS_SECRET not in shown and GH not in shown
    assert "[AWS secret access key" in shown and "[GitHub token" in shown
    assert f"/messages/{secret_id}/" in shown  # where the audited reveal is
    assert "lunch at noon?" in admin.get(f"/admin/messaging/message/{plain_id}/change/").content.decode()

    for listing in (
        f"/admin/messaging/message/?text__contains={AWS_SECRET[:12]}",
        f"/admin/messaging/message/?summary__startswith=with%20{GH[:10]}",
        f"/admin/messaging/message/?q={GH[:10]}",
        f"/admin/messaging/delivery/?message__text__contains={AWS_SECRET[:12]}",
    ):
        answer = admin.get(listing)
        assert answer.status_code in (200, 400), listing
        assert secret_id not in answer.content.decode(), listing
    assert plain_id in admin.get("/admin/messaging/message/?q=plain note").content.decode()

    [delivery] = Message.objects.get(pk=secret_id).deliveries.all()
    for other in (f"/admin/messaging/delivery/{delivery.pk}/change/", "/admin/messaging/auditevent/"):
        assert AWS_SECRET not in admin.get(other).content.decode(), other
    assert not AuditEvent.objects.filter(kind="message.revealed").exists()


def test_a_reveal_over_rest_is_audited_and_sessions_cannot_reveal(api, register, send, operator_token):
    alice, bob = register("alice"), register("bob")
    send(alice, "bob", SECRET_TEXT)
    hold = _held(api, operator_token)
    assert api.post(f"holds/{hold['id']}/reveal", bob.token).status_code == 403
    assert api.post(f"holds/{hold['id']}/reveal", alice.token).status_code == 403
    assert not AuditEvent.objects.filter(kind="message.revealed").exists()
    shown = api.post(f"holds/{hold['id']}/reveal", operator_token)
    assert shown.status_code == 200 and shown.json_body["text"] == SECRET_TEXT
    assert AuditEvent.objects.filter(kind="message.revealed", target=hold["message_id"]).count() == 1


# --- approving an escalated hold ----------------------------------------------------------------


def test_approving_an_escalated_hold_takes_a_reason_and_the_recipient_gets_it_as_sent(
    api, register, send, operator_token
):
    alice, bob = register("alice"), register("bob")
    send(alice, "bob", SECRET_TEXT)
    hold = _held(api, operator_token)
    assert hold["escalate"] == "required"
    refused = api.post(f"holds/{hold['id']}/approve", operator_token)
    assert (refused.status_code, refused.json_body["reason"]) == (400, "reason_required")
    blank = api.post("holds/decide", operator_token, {"ids": [hold["id"]], "approve": True, "reason": "  "})
    assert (blank.status_code, blank.json_body["reason"]) == (400, "reason_required")
    assert _held(api, operator_token)["id"] == hold["id"]  # still held
    approved = api.post(f"holds/{hold['id']}/approve", operator_token, {"reason": "rotating it right after"})
    assert approved.status_code == 200 and approved.json_body["state"] == "queued"
    [got] = api.get("inbox", bob.token).json_body["messages"]
    assert got["text"] == SECRET_TEXT


def test_denying_or_approving_a_plain_policy_hold_needs_no_reason(api, register, send, operator_token):
    alice, bob = register("alice"), register("bob")
    api.call("PUT", f"sessions/{bob.id}/policy", operator_token, {"policy": "hold"})
    send(alice, "bob", "hello")
    hold = _held(api, operator_token)
    assert hold["escalate"] is None
    assert api.post(f"holds/{hold['id']}/approve", operator_token).status_code == 200


@pytest.mark.parametrize("approve", [True, False])
def test_the_console_form_refuses_approving_an_escalated_hold_without_a_reason(
    api,
    register,
    send,
    operator_token,
    operator_client,  # noqa: F811
    approve,
):
    alice, _bob = register("alice"), register("bob")
    send(alice, "bob", SECRET_TEXT)
    hold = _held(api, operator_token)
    action = "approve" if approve else "deny"
    answer = csrf_post(
        operator_client,
        "/holds/decide",
        {"delivery_ids": hold["id"], "action": action, "reason": ""},
        HTTP_ACCEPT="application/json",
    )
    if approve:
        assert (answer.status_code, answer.json()["reason"]) == (400, "reason_required")
        assert _held(api, operator_token)["id"] == hold["id"]
    else:
        assert answer.status_code == 200 and answer.json()["moved"] == [hold["id"]]


def test_the_message_status_and_the_senders_notice_mask_a_secret_in_the_summary(
    api, register, send, operator_token
):
    """The status an operator reads over REST, and the hub's notice of the decision (hub traffic,
    shown in the console's feed as it is), carry the summary masked."""
    from console.selectors import feed_rows

    alice, _bob = register("alice"), register("bob")
    message_id = send(alice, "bob", "nothing in the text", summary=f"use {GH}").json_body["id"]
    status = api.get(f"messages/{message_id}", operator_token).json_body
    assert GH not in json.dumps(status) and "[GitHub token" in status["summary"]
    hold = _held(api, operator_token)
    assert api.post(f"holds/{hold['id']}/deny", operator_token, {"reason": "no tokens"}).status_code == 200
    assert GH not in json.dumps(feed_rows())
