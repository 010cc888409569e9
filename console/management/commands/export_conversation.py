"""`python manage.py export_conversation`: export one conversation (a pair of sessions or a team)
as JSON Lines or a Markdown transcript, to a file (0600) or stdout. See docs/data.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from messaging.errors import SwitchboardError
from messaging.principals import command_line_operator
from messaging.services.export import (
    FORMATS,
    export_pair_scope,
    export_stream,
    parse_when,
    session_by_id_or_ref,
)
from teams.services.export import team_export_scope


class Command(BaseCommand):
    help = (
        "Export the messages between two sessions (--pair A B, by id or ref) or among a team's "
        "roster (--team ID), optionally within --since/--until, as JSON Lines or Markdown."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--pair", nargs=2, metavar=("A", "B"), help="two sessions, each by id or ref")
        which.add_argument("--team", metavar="ID", help="a team id")
        parser.add_argument("--since", default="", help="ISO 8601 date or date-time (UTC if no offset)")
        parser.add_argument("--until", default="", help="ISO 8601 date or date-time, exclusive")
        parser.add_argument("--format", dest="fmt", choices=FORMATS, default="jsonl")
        parser.add_argument("--output", default="-", help="a file to write (mode 0600), or - for stdout")
        parser.add_argument(
            "--include-held",
            action="store_true",
            help="include the text of held, denied and expired messages (default: their state only)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = parse_when(options["since"], name="--since")
            until = parse_when(options["until"], name="--until")
            if options["pair"]:
                a, b = (session_by_id_or_ref(v) for v in options["pair"])
                scope = export_pair_scope(a=a, b=b, since=since, until=until)
            else:
                scope = team_export_scope(team_id=options["team"], since=since, until=until)
            actor = command_line_operator()
            chunks = export_stream(
                scope, fmt=options["fmt"], actor=actor, include_held=options["include_held"]
            )
        except SwitchboardError as exc:
            raise CommandError(exc.detail) from exc
        output = options["output"]
        if output == "-":
            for chunk in chunks:
                self.stdout.write(chunk, ending="")
            self.stdout.flush()
            return
        path = Path(output)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise CommandError(f"Cannot write {path}: {exc.strerror}.") from exc
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: the export holds texts
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.writelines(chunks)
        self.stderr.write(f"Wrote {path}.")
