"""Files attached to messages: stored once under their SHA-256, checked end to end, limited per
tier, and delivered into the recipient's own folder under names the hub makes up.

Uploads stream to disk (hashed as they are written, stopped at the limit); a session's uploads
that no message uses yet are bounded by its quota, and a periodic job removes stored files no
message uses once their grace period has passed (`files_orphans_remove`).

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
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile, StopFutureHandlers
from django.db import IntegrityError, transaction
from django.db.models import Max, ProtectedError, Q, QuerySet, Sum
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.utils import timezone

from federation.models import Attachment, FileUpload, MessageAttachment
from messaging.errors import Invalid, NotFound, TooLarge
from messaging.models import Delivery
from messaging.sensitivity import FILE_SCAN_BYTES
from switchboard_agent.home import private_folder

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
    """The files folder; UnsafeHome when another user could write in it and swap what it stores."""
    return private_folder(Path(settings.SWITCHBOARD_FILES_DIR), "SWITCHBOARD_FILES_DIR")


def _store_path(sha256: str) -> Path:
    return _root() / "store" / sha256[:2] / sha256


def _new_temp() -> tuple[Path, BinaryIO]:
    """A new private file in the store's folder (the same file system, so keeping it is a rename)."""
    folder = _root() / "store"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f".upload.{secrets.token_hex(8)}.tmp"
    return path, os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


def file_store(*, data: bytes) -> Attachment:
    """Keep `data` under its SHA-256 (once, whoever stores it again) and return its record. For
    bytes already in memory (a forwarded message's files); uploads stream (`file_upload`)."""
    if len(data) > upload_limit():
        raise TooLarge(
            f"A file takes at most {upload_limit() // MB} MB.", size=len(data), limit=upload_limit()
        )
    tmp, handle = _new_temp()
    with handle:
        handle.write(data)
    return _keep(tmp, sha256=hashlib.sha256(data).hexdigest(), size=len(data), session_id=None)


def _keep(tmp: Path, *, sha256: str, size: int, session_id: Any) -> Attachment:
    """Move a finished temporary file to its place in the store and record it (and, for an
    upload, the session's use of its quota). The file is put in place under the record's row
    lock, which the orphan cleanup takes too: a file being stored again is never removed."""
    path = _store_path(sha256)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for attempt in range(2):
        try:
            with transaction.atomic():
                attachment, _ = Attachment.objects.select_for_update().get_or_create(
                    sha256=sha256, defaults={"size": size}
                )
                os.replace(tmp, path)  # the same bytes, whoever stored them first
                if session_id is not None:
                    FileUpload.objects.update_or_create(
                        session_id=session_id,
                        attachment=attachment,
                        defaults={"size": size, "uploaded_at": timezone.now()},
                    )
            return attachment
        except IntegrityError:
            if attempt:  # two first stores of the same bytes: the other one created the row
                raise
    raise AssertionError("unreachable")


def _unused_uploads(session_id: Any) -> Any:
    """The session's uploads of files no message uses yet: what its quota counts."""
    return FileUpload.objects.filter(session_id=session_id, attachment__uses__isnull=True)


class StoreUploadHandler(FileUploadHandler):
    """Django upload handler that writes the `file` field straight into the store's folder,
    hashing as it writes, and stops at `limit` bytes (the partial file is removed and the upload
    refused with TooLarge before another chunk is read). Memory holds one chunk at a time."""

    def __init__(self, *, limit: int, refusal: str) -> None:
        super().__init__()
        self.limit = limit
        self.refusal = refusal
        self.size = 0
        self.digest = hashlib.sha256()
        self.path: Path | None = None
        self._handle: BinaryIO | None = None

    def new_file(self, field_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, *args, **kwargs)
        if field_name != "file" or self.path is not None:
            raise SkipFile()  # one file per upload, in the field named `file`
        self.path, self._handle = _new_temp()
        raise StopFutureHandlers()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        assert self._handle is not None
        self.size += len(raw_data)
        if self.size > self.limit:
            self.discard()
            raise TooLarge(self.refusal, limit=self.limit)
        self.digest.update(raw_data)
        self._handle.write(raw_data)

    def file_complete(self, file_size: int) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        # None: nothing goes into request.FILES; the bytes are in `self.path`, kept by `file_upload`.

    def discard(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def file_upload(*, session_id: Any, meta: dict[str, Any], stream: Any, encoding: str | None) -> Attachment:
    """Store the file of a multipart upload (field `file`) for a session, streaming it to disk.
    Refused with TooLarge, with nothing kept, past the per-file limit or past the session's
    quota: the bytes of its uploads that no message uses yet (SWITCHBOARD_FILE_QUOTA_BYTES), where
    uploading a file it already holds again adds nothing. Reading stops at the per-file limit or
    at the room left plus the largest file the session holds (a repeat of which still fits)."""
    held = _unused_uploads(session_id).aggregate(total=Sum("size"), largest=Max("size"))
    room = settings.SWITCHBOARD_FILE_QUOTA_BYTES - (held["total"] or 0)
    limit = min(upload_limit(), room + (held["largest"] or 0))
    if limit <= 0:
        raise TooLarge(_quota_refusal(), quota=settings.SWITCHBOARD_FILE_QUOTA_BYTES)
    refusal = (
        _quota_refusal() if limit < upload_limit() else f"A file takes at most {upload_limit() // MB} MB."
    )
    handler = StoreUploadHandler(limit=limit, refusal=refusal)
    try:
        MultiPartParser(meta, stream, [handler], encoding).parse()
        if handler.path is None or not handler.path.exists():
            raise MultiPartParserError("no file field")
        sha256 = handler.digest.hexdigest()
        if handler.size > room and not _unused_uploads(session_id).filter(attachment__sha256=sha256).exists():
            raise TooLarge(_quota_refusal(), quota=settings.SWITCHBOARD_FILE_QUOTA_BYTES)
        return _keep(handler.path, sha256=sha256, size=handler.size, session_id=session_id)
    except MultiPartParserError as exc:
        raise Invalid("bad_upload", "Send the file as multipart/form-data in a field named `file`.") from exc
    finally:
        handler.discard()  # the partial or refused file; a kept one was renamed into the store


def _quota_refusal() -> str:
    return (
        f"This session's uploads that no message uses yet reach its quota of "
        f"{settings.SWITCHBOARD_FILE_QUOTA_BYTES // MB} MB: attach them to messages, or wait until unused "
        f"ones are removed ({settings.SWITCHBOARD_FILE_ORPHAN_SECONDS // 3600} h after their last upload)."
    )


def files_orphans_remove(*, now: datetime | None = None, batch: int = 500) -> int:
    """Remove stored files that no message uses, stored and last uploaded more than
    SWITCHBOARD_FILE_ORPHAN_SECONDS ago; return how many. Each goes under its row's lock, checked
    again there, so a send attaching it or an upload storing it again at that moment keeps it
    (the send's lookup locks the row too, `files_attach`). Safe to run on two workers at once."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.SWITCHBOARD_FILE_ORPHAN_SECONDS)
    candidates = list(
        Attachment.objects.filter(created_at__lt=cutoff, uses__isnull=True)
        .exclude(uploads__uploaded_at__gte=cutoff)
        .values_list("pk", "sha256")[:batch]
    )
    removed = 0
    for pk, sha256 in candidates:
        path = _store_path(sha256)
        aside = path.with_name(f".{sha256}.{secrets.token_hex(4)}.removed")
        try:
            with transaction.atomic():
                if not Attachment.objects.select_for_update().filter(pk=pk).exists():
                    continue
                if (
                    MessageAttachment.objects.filter(attachment_id=pk).exists()
                    or FileUpload.objects.filter(attachment_id=pk, uploaded_at__gte=cutoff).exists()
                ):
                    continue
                if path.exists():
                    os.replace(path, aside)  # put back below if the delete does not commit
                Attachment.objects.filter(pk=pk).delete()
        except (IntegrityError, ProtectedError):
            if aside.exists():
                os.replace(aside, path)
            continue
        aside.unlink(missing_ok=True)
        removed += 1
    return removed


def file_read(*, sha256: str) -> bytes:
    return _store_path(sha256).read_bytes()


def file_head(*, sha256: str, size: int = FILE_SCAN_BYTES) -> bytes:
    """The first `size` bytes of a stored file (what the sensitive tier scans); empty when no
    file has that SHA-256 (attaching it fails later, with its own error)."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return b""
    try:
        with _store_path(sha256).open("rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


def file_head_held(*, sha256: str, session_id: Any, size: int = FILE_SCAN_BYTES) -> bytes:
    """`file_head` of a file the session holds (`files_held_by`); empty for any other. What the
    scan of a send finds never depends on a file its sender could not attach: scanned, another
    session's file would change the send's answer (held as sensitive instead of refused as
    unknown), and so tell whether the hub stores a content the sender guessed."""
    if not files_held_by(session_id, Attachment.objects.filter(sha256=sha256)).exists():
        return b""
    return file_head(sha256=sha256, size=size)


def envelope_file_heads(envelope: dict[str, Any], size: int = FILE_SCAN_BYTES) -> list[bytes]:
    """The first `size` bytes of each file a forwarded message carries, decoded from the envelope
    (for the sensitive tier; a file that does not decode is left out: it is not stored either)."""
    heads = []
    for item in (envelope.get("files") or [])[:MAX_FILES] if isinstance(envelope.get("files"), list) else []:
        if not isinstance(item, dict):
            continue
        data = str(item.get("data", ""))[: (size // 3 + 1) * 4]  # base64: 4 characters per 3 bytes
        try:
            heads.append(base64.b64decode(data, validate=True)[:size])
        except ValueError:
            continue
    return heads


def _display_name(name: str) -> str:
    base = os.path.basename(str(name).replace("\\", "/")).strip() or "file"
    return base[:255]


def files_attach(
    *, message_id: Any, sender_id: Any, files: list[dict[str, str]], tier: str
) -> list[MessageAttachment]:
    """Attach stored files (by SHA-256, with a display name) to a message about to go on `tier`.
    Raises before anything is kept when a file is not one the sender holds (`files_held_by`), too
    many, or too large for the tier."""
    if len(files) > MAX_FILES:
        raise Invalid("too_many_files", f"A message takes at most {MAX_FILES} files.")
    per_file, per_message = TIER_LIMITS.get(tier, TIER_LIMITS["host"])
    # Locked until the send commits: the orphan cleanup cannot remove a file a send is attaching.
    wanted = [str(f.get("sha256", "")) for f in files]
    found = {
        a.sha256: a
        for a in files_held_by(sender_id, Attachment.objects.select_for_update().filter(sha256__in=wanted))
    }
    total = 0
    rows = []
    for position, ref in enumerate(files):
        attachment = found.get(str(ref.get("sha256", "")))
        if attachment is None:
            raise NotFound(
                f"You have no file with the SHA-256 {ref.get('sha256')!r}: upload it first (POST /api/v1/files)."
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


def files_held_by(session_id: Any, attachments: QuerySet[Attachment]) -> QuerySet[Attachment]:
    """Those of `attachments` the session holds: it uploaded them, or a message carrying them was
    handed to it. A session attaches only these: a stored file's SHA-256 alone (seen in a log, or
    guessed from a few likely contents) neither sends another session's file nor tells whether
    this hub stores it."""
    received = MessageAttachment.objects.filter(
        message_id__in=Delivery.objects.filter(recipient_id=session_id).values("message_id")
    ).exclude(delivered_path="")
    uploaded = FileUpload.objects.filter(session_id=session_id)
    return attachments.filter(
        Q(pk__in=uploaded.values("attachment_id")) | Q(pk__in=received.values("attachment_id"))
    )


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


def files_of_purged_messages_drop(*, message_ids: list[Any], **_: Any) -> int:
    """Forget which files purged messages carried (`messages_purged`): a stored file no message
    refers to any more is then cleaned up like any other unreferenced file."""
    deleted, _ = MessageAttachment.objects.filter(message_id__in=message_ids).delete()
    return deleted
