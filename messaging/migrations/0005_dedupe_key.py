"""The dedupe rule looks messages up by one key (`Message.dedupe_key`) instead of (sender, text).

A message's key is the SHA-256 of `<sender id as 32 hex digits>:<the text's SHA-256>`, written
out here as a migration must not change with the code (a test holds
`messaging.services.pair.dedupe_key` to it). Messages of the last day, or of the dedupe window
if it is longer, get their key; older ones can no longer match and keep it empty.
"""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def dedupe_key(sender_id, sha256):
    return hashlib.sha256(f"{sender_id.hex}:{sha256}".encode()).hexdigest()


def keys_for_recent_messages(apps, schema_editor):
    Message = apps.get_model("messaging", "Message")
    window = max(timedelta(days=1), timedelta(seconds=getattr(settings, "SWITCHBOARD_DEDUPE_SECONDS", 0)))
    recent = Message.objects.filter(created_at__gte=timezone.now() - window, sender__isnull=False)
    keyed = []
    for message in recent.only("id", "sender_id", "sha256").iterator(chunk_size=2000):
        message.dedupe_key = dedupe_key(message.sender_id, message.sha256)
        keyed.append(message)
        if len(keyed) == 2000:
            Message.objects.bulk_update(keyed, ["dedupe_key"])
            keyed = []
    if keyed:
        Message.objects.bulk_update(keyed, ["dedupe_key"])


class Migration(migrations.Migration):
    dependencies = [
        ("messaging", "0004_unread_counts"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="message",
            name="message_dedupe",
        ),
        migrations.AddField(
            model_name="message",
            name="dedupe_key",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.RunPython(keys_for_recent_messages, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(fields=["dedupe_key", "created_at"], name="message_dedupe_key"),
        ),
    ]
