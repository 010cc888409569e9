"""`python manage.py delete_session_data SESSION_ID --yes`: delete one session's data on request."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from messaging.errors import SwitchboardError
from messaging.principals import command_line_operator
from messaging.services.retention import session_data_delete


class Command(BaseCommand):
    help = (
        "Delete every message a session sent or received, and its pins and per-sender policies "
        "(an operator's action, audited). The session itself stays, so the audit still names it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "session_id", help="The session's id (a UUID, as the console and the API show it)."
        )
        parser.add_argument("--yes", action="store_true", help="Delete without asking (nothing can undo it).")

    def handle(self, *args: Any, session_id: str, yes: bool, **options: Any) -> None:
        if not yes:
            raise CommandError("This deletes the session's messages for good; run it again with --yes.")
        try:
            uuid.UUID(session_id)
        except ValueError:
            raise CommandError(f"{session_id!r} is not a session id (a UUID).") from None
        try:
            counts = session_data_delete(session_id=session_id, actor=command_line_operator())
        except SwitchboardError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(json.dumps(counts))
