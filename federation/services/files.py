"""Files attached to messages: stored once under their SHA-256, checked end to end, limited per
tier, and delivered into the recipient's own folder under names the hub makes up.

Store:     $SWITCHBOARD_FILES_DIR/store/<sha[:2]>/<sha>
Delivered: $SWITCHBOARD_FILES_DIR/sessions/<recipient id>/<message id>/<n>-<sha[:12]><.ext>
Between hubs the bytes travel inside the (signed, for the relay also sealed) envelope; the
signature covers each file's SHA-256, so a file changed on the way is left out and reported.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from federation.models import Attachment, MessageAttachment
from messaging.errors import Invalid, NotFound, TooLarge

MAX_FILES = 10
MB = 1024 * 1024
# tier → (per file, per message), in bytes
TIER_LIMITS = {
    "host": (100 * MB, 200 * MB),
    "channel": (100 * MB, 200 * MB),
    "lan": (50 * MB, 100 * MB),
    "relay": (25 * MB, 50 * MB),
}
_SAFE_EXT = re.compile(r"^\.[A-Za-z0-9]{1,10}$")


def upload_limit() -> int:
    """The most bytes one uploaded file may have (a file for this hub's own sessions)."""
    return TIER_LIMITS["host"][0]


def _root() -> Path:
    root = Path(settings.SWITCHBOARD_FILES_DIR)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _store_path(sha256: str) -> Path:
    return _root() / "store" / sha256[:2] / sha256


def file_store(*, data: bytes) -> Attachment:
    """Keep `data` under its SHA-256 (once, whoever uploads it again) and return its record."""
    if len(data) > TIER_LIMITS["host"][0]:
        raise TooLarge(
            f"A file takes at most {TIER_LIMITS['host'][0] // MB} MB.",
            size=len(data),
            limit=TIER_LIMITS["host"][0],
        )
    sha256 = hashlib.sha256(data).hexdigest()
    path = _store_path(sha256)
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{sha256}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    try:
        with transaction.atomic():
            attachment, _ = Attachment.objects.get_or_create(sha256=sha256, defaults={"size": len(data)})
    except IntegrityError:
        attachment = Attachment.objects.get(sha256=sha256)
    return attachment


def file_read(*, sha256: str) -> bytes:
    return _store_path(sha256).read_bytes()


def _display_name(name: str) -> str:
    base = os.path.basename(str(name).replace("\\", "/")).strip() or "file"
    return base[:255]


def files_attach(*, message_id: Any, files: list[dict[str, str]], tier: str) -> list[MessageAttachment]:
    """Attach stored files (by SHA-256, with a display name) to a message about to go on `tier`.
    Raises before anything is kept when a file is unknown, too many, or too large for the tier."""
    if len(files) > MAX_FILES:
        raise Invalid("too_many_files", f"A message takes at most {MAX_FILES} files.")
    per_file, per_message = TIER_LIMITS.get(tier, TIER_LIMITS["host"])
    found = {
        a.sha256: a for a in Attachment.objects.filter(sha256__in=[str(f.get("sha256", "")) for f in files])
    }
    total = 0
    rows = []
    for position, ref in enumerate(files):
        attachment = found.get(str(ref.get("sha256", "")))
        if attachment is None:
            raise NotFound(
                f"No uploaded file has the SHA-256 {ref.get('sha256')!r}; upload it first (POST /api/v1/files)."
            )
        if attachment.size > per_file:
            raise TooLarge(
                f"{_display_name(ref.get('name', ''))} has {attachment.size:,} bytes; on the {tier} tier a file "
                f"takes at most {per_file // MB} MB.",
                size=attachment.size,
                limit=per_file,
            )
        total += attachment.size
        rows.append(
            MessageAttachment(
                message_id=message_id,
                attachment=attachment,
                position=position,
                name=_display_name(ref.get("name") or attachment.sha256[:12]),
            )
        )
    if total > per_message:
        raise TooLarge(
            f"The files add up to {total:,} bytes; on the {tier} tier a message carries at most {per_message // MB} MB.",
            size=total,
            limit=per_message,
        )
    return MessageAttachment.objects.bulk_create(rows)


def files_limits_check(*, message_id: Any, tier: str) -> None:
    """Raise TooLarge when the message's files exceed `tier`'s limits (checked again on re-routing)."""
    per_file, per_message = TIER_LIMITS.get(tier, TIER_LIMITS["host"])
    sizes = list(
        MessageAttachment.objects.filter(message_id=message_id).values_list("attachment__size", flat=True)
    )
    if any(size > per_file for size in sizes) or sum(sizes) > per_message:
        raise TooLarge(f"The files are too large for the {tier} tier.", limit=per_message)


def files_for_envelope(*, message_id: Any) -> list[dict[str, Any]]:
    """The files of a message as they travel: name, size, SHA-256 (signed) and the bytes."""
    out = []
    for row in (
        MessageAttachment.objects.filter(message_id=message_id, problem="")
        .select_related("attachment")
        .order_by("position")
    ):
        out.append(
            {
                "name": row.name,
                "size": row.attachment.size,
                "sha256": row.attachment.sha256,
                "data": base64.b64encode(file_read(sha256=row.attachment.sha256)).decode("ascii"),
            }
        )
    return out


def files_deliver(*, message_id: Any, recipient_id: Any) -> list[dict[str, Any]]:
    """Put a message's files into the recipient's own folder (idempotent) and list them."""
    rows = list(
        MessageAttachment.objects.filter(message_id=message_id)
        .select_related("attachment")
        .order_by("position")
    )
    listed = []
    for row in rows:
        if row.problem:
            listed.append({"name": row.name, "sha256": "", "problem": row.problem})
            continue
        if not row.delivered_path:
            folder = _root() / "sessions" / str(recipient_id) / str(message_id)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            ext = os.path.splitext(row.name)[1]
            target = (
                folder
                / f"{row.position + 1}-{row.attachment.sha256[:12]}{ext if _SAFE_EXT.match(ext) else ''}"
            )
            if not target.exists():
                # Written aside, then renamed: a reader never sees half a file, and two transports
                # handing the same message over at once both end with the same whole file.
                tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(file_read(sha256=row.attachment.sha256))
                os.replace(tmp, target)
            MessageAttachment.objects.filter(pk=row.pk).update(delivered_path=str(target))
            row.delivered_path = str(target)
        listed.append(
            {
                "name": row.name,
                "sha256": row.attachment.sha256,
                "size": row.attachment.size,
                "path": row.delivered_path,
            }
        )
    return listed


def tier_of(trust: str) -> str:
    """The tier a trust value was earned on (`lan-verified` → `lan`); host for anything else."""
    tier = trust.split("-", 1)[0]
    return tier if tier in TIER_LIMITS else "host"


def files_receive(
    *, envelope: dict[str, Any], message_id: Any, recipient: Any, trust: str
) -> list[dict[str, Any]]:
    """Keep the files of a forwarded message: each one whose bytes match its signed SHA-256 is
    stored and delivered; a changed or missing one is left out and reported. When the sender's
    signature failed, every file is withheld."""
    files = envelope.get("files") or []
    if not isinstance(files, list) or not files:
        return []
    rows = []
    placeholder = None
    total = 0
    for position, item in enumerate(files[:MAX_FILES]):
        if not isinstance(item, dict):
            continue
        name = _display_name(str(item.get("name", "")))
        claimed = str(item.get("sha256", ""))
        problem = ""
        attachment = None
        per_file, per_message = TIER_LIMITS.get(tier_of(trust), TIER_LIMITS["host"])
        if trust == "unverified":
            problem = "withheld: the sending hub's signature did not verify"
        elif (
            not isinstance(item.get("size"), int)
            or item["size"] > per_file
            or total + item["size"] > per_message
        ):
            problem = f"left out: larger than the {tier_of(trust)} tier carries"
        else:
            total += item["size"]
            try:
                data = base64.b64decode(str(item.get("data", "")), validate=True)
            except ValueError:
                data = None
            if data is None or len(data) != item["size"] or hashlib.sha256(data).hexdigest() != claimed:
                problem = "left out: the file changed on the way (SHA-256 mismatch)"
            else:
                attachment = file_store(data=data)
        if attachment is None:
            if placeholder is None:
                placeholder = file_store(data=b"")
            attachment = placeholder
        rows.append(
            MessageAttachment(
                message_id=message_id, attachment=attachment, position=position, name=name, problem=problem
            )
        )
    MessageAttachment.objects.bulk_create(rows)
    return [{"name": r.name, "problem": r.problem} for r in rows]
