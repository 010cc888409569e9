"""`python manage.py operator_create NAME`: make (or reset) a console login for a human operator.

The password comes from stdin with `--password-stdin`, else from SWITCHBOARD_OPERATOR_PASSWORD,
else it is asked for twice on the terminal. It is never taken from the command line, where other
users of the machine could read it."""

from __future__ import annotations

import getpass
import os
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from messaging.principals import command_line_operator
from messaging.services.operators import operator_accounts_changed_by


class Command(BaseCommand):
    help = (
        "Create or reset an operator login for the console: a staff user who also opens the Django "
        "admin, unless --no-admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The operator's username.")
        parser.add_argument("--password-stdin", action="store_true", help="Read the password from stdin.")
        parser.add_argument(
            "--no-admin",
            action="store_true",
            help="A console operator without raw access to every table in the Django admin.",
        )

    def _password(self, options: dict[str, Any]) -> str:
        if options["password_stdin"]:
            return sys.stdin.readline().rstrip("\n")
        from_env = os.environ.get("SWITCHBOARD_OPERATOR_PASSWORD", "")
        if from_env:
            return from_env
        if not sys.stdin.isatty():
            raise CommandError("Give the password with --password-stdin or SWITCHBOARD_OPERATOR_PASSWORD.")
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("The two passwords differ.")
        return first

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        name = name.strip()
        if not name or len(name) > 150:
            raise CommandError("The username takes 1 to 150 characters.")
        password = self._password(options)
        User = get_user_model()
        user = User.objects.filter(username=name).first() or User(username=name)
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        admin = not options["no_admin"]
        created = user.pk is None
        # The save is audited (`operator.created`, or `operator.changed` with what changed) by
        # `messaging.services.operators`, which sees every change to a user, in this transaction.
        with transaction.atomic(), operator_accounts_changed_by(command_line_operator()):
            user.is_staff = True
            user.is_active = True
            user.is_superuser = admin
            user.set_password(password)
            user.save()
        self.stdout.write(f"Operator {name!r} {'created' if created else 'updated'}; log in at /login/.")
