"""`python manage.py operator_unlock NAME`: lift the login lockout of an operator's username at once,
instead of waiting for SWITCHBOARD_LOGIN_COOLOFF_SECONDS to pass."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from messaging.principals import command_line_operator
from messaging.services.operators import operator_unlock


class Command(BaseCommand):
    help = "Lift the login lockout (too many failed passwords) of a console username."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The operator's username.")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        name = name.strip()
        cleared = operator_unlock(name=name, actor=command_line_operator())
        self.stdout.write(
            f"Login of {name!r} unlocked." if cleared else f"{name!r} had no failed logins recorded."
        )
