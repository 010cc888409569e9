"""Retention and files: a purged message no longer refers to its files, so the stored file becomes
unreferenced (and the unreferenced-file cleanup can take it)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from federation.models import MessageAttachment
from messaging.models import Delivery, Message
from messaging.services.retention import retention_purge
from tests.federation.test_files import _upload


@pytest.mark.django_db(transaction=True)
def test_a_purged_message_lets_go_of_its_files(api, register, settings):
    # Given alice sent bob a file, bob read it, and it is past retention
    settings.SWITCHBOARD_MESSAGE_RETENTION_DAYS = 30
    alice = register("alice")
    register("bob")
    sha = _upload(api, alice.token, b"old report", "report.md")["sha256"]
    sent = api.post(
        "messages",
        alice.token,
        {"to": "bob", "message": "see file", "files": [{"sha256": sha, "name": "r.md"}]},
    )
    message_id = sent.json_body["id"]
    assert MessageAttachment.objects.filter(message_id=message_id).exists()
    Message.objects.filter(pk=message_id).update(created_at=timezone.now() - timedelta(days=31))
    Delivery.objects.filter(message_id=message_id).update(state="read")

    # When retention runs
    assert retention_purge().messages == 1

    # Then nothing refers to the stored file any more
    assert not MessageAttachment.objects.filter(message_id=message_id).exists()
