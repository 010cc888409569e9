"""Loop protection counts a pair's recent texts by one key (`Message.pair_key`) instead of joining
messages to their deliveries.

A message's key is the first 16 bytes of the SHA-256 of `<sender id>><recipient id>` (each as 32
hex digits), written out here as a migration must not change with the code (a test holds
`messaging.services.pair.pair_key` to it). Messages within the longest window a rule looks back
(a day at least) get the key of their delivery's recipient; older ones are never counted again
and keep it empty.
"""

import hashlib
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def pair_key(sender_id, recipient_id):
    return uuid.UUID(bytes=hashlib.sha256(f"{sender_id.hex}>{recipient_id.hex}".encode()).digest()[:16])


def keys_for_recent_messages(apps, schema_editor):
    Delivery = apps.get_model("messaging", "Delivery")
    Message = apps.get_model("messaging", "Message")
    windows = (
        getattr(settings, "SWITCHBOARD_DEDUPE_SECONDS", 0),
        getattr(settings, "SWITCHBOARD_LOOP_WINDOW_SECONDS", 0),
        24 * 3600,
    )
    since = timezone.now() - timedelta(seconds=max(windows))
    recent = Delivery.objects.filter(message__created_at__gte=since, message__sender__isnull=False)
    keyed = []
    for message_id, sender_id, recipient_id in recent.values_list(
        "message_id", "message__sender_id", "recipient_id"
    ).iterator(chunk_size=2000):
        keyed.append(Message(id=message_id, pair_key=pair_key(sender_id, recipient_id)))
        if len(keyed) == 2000:
            Message.objects.bulk_update(keyed, ["pair_key"])
            keyed = []
    if keyed:
        Message.objects.bulk_update(keyed, ["pair_key"])


class Migration(migrations.Migration):
    dependencies = [
        ("messaging", "0005_dedupe_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="pair_key",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.RunPython(keys_for_recent_messages, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(fields=["pair_key", "created_at"], name="message_pair_recent"),
        ),
    ]
