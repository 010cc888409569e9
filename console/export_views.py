"""Conversation downloads for operators: a pair chosen on a session's page, or a team's roster.
Each view parses the query, builds the scope, and streams what `messaging.services.export`
renders, as an attachment with a file name that says what it holds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator
from datetime import datetime
from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET

from console.cross_site import same_origin_only
from console.views import operator_required
from messaging.errors import Invalid, NotFound
from messaging.principals import operator_principal
from messaging.services.export import (
    ExportScope,
    export_filename,
    export_pair_scope,
    export_stream,
    parse_when,
    session_by_id_or_ref,
)
from teams.services.export import team_export_scope

CONTENT_TYPES = {"jsonl": "application/x-ndjson; charset=utf-8", "md": "text/markdown; charset=utf-8"}
Build = Callable[[datetime | None, datetime | None], ExportScope]
CHUNK_CHARS = 64 * 1024


def _joined(chunks: Generator[str, None, None]) -> str | None:
    """The next chunks joined up to about CHUNK_CHARS, or None once the export has ended."""
    parts: list[str] = []
    size = 0
    for part in chunks:
        parts.append(part)
        size += len(part)
        if size >= CHUNK_CHARS:
            break
    return "".join(parts) if parts else None


async def _streamed(chunks: Generator[str, None, None]) -> AsyncIterator[str]:
    """The export as an async iterator, for ASGI: Django would read a sync iterator whole into
    memory before sending it. Each step reads on the request's database thread; the export is
    closed (and so audited) however the response ends."""
    read = sync_to_async(_joined, thread_sensitive=True)
    try:
        while (part := await read(chunks)) is not None:
            yield part
    finally:
        await sync_to_async(chunks.close, thread_sensitive=True)()


def _download(request: HttpRequest, build: Build) -> HttpResponse:
    """Parse the range and format, build the scope, and answer with the streamed export."""
    try:
        since = parse_when(request.GET.get("since"), name="since")
        until = parse_when(request.GET.get("until"), name="until")
        scope = build(since, until)
        fmt = request.GET.get("format", "jsonl")
        chunks = export_stream(
            scope,
            fmt=fmt,
            actor=operator_principal(request.user.get_username()),
            include_held=request.GET.get("include_held") == "1",
        )
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    except Invalid as exc:
        return HttpResponseBadRequest(exc.detail, content_type="text/plain; charset=utf-8")
    body = _streamed(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(body, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{export_filename(scope, fmt=fmt)}"'
    response["Cache-Control"] = "no-store"
    return response


@same_origin_only
@require_GET
@operator_required
def session_pair_export(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The conversation between this session and the one named by `with` (id or ref)."""

    def build(since: datetime | None, until: datetime | None) -> ExportScope:
        session = session_by_id_or_ref(str(session_id))
        other = request.GET.get("with", "").strip()
        if not other:
            raise Invalid("bad_pair", "Choose the other session of the pair.")
        return export_pair_scope(a=session, b=session_by_id_or_ref(other), since=since, until=until)

    return _download(request, build)


@same_origin_only
@require_GET
@operator_required
def team_export(request: HttpRequest, team_id: UUID) -> HttpResponse:
    """The messages among a team's roster."""
    return _download(
        request, lambda since, until: team_export_scope(team_id=team_id, since=since, until=until)
    )
