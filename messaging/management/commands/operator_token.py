"""`python manage.py operator_token NAME`: mint an operator token; it is the last line printed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from messaging.services.operator_tokens import operator_token_create


class Command(BaseCommand):
    help = "Create an operator token (acts as a human operator: approve holds, set policy)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who or what the token is for, e.g. 'alice-laptop'.")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        try:
            token = operator_token_create(name=name)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(f"Operator token {name!r} created. It is shown once; keep it secret.")
        self.stdout.write(token)
