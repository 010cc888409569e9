"""`python manage.py operator_token NAME`: mint an operator token; it is the last line printed.
With `--revoke` or `--restore`: revoke or restore the tokens named NAME instead (audited, as the
Django admin's actions are), for an operator who has no Django admin."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from messaging.errors import SwitchboardError
from messaging.principals import command_line_operator
from messaging.services.operator_tokens import operator_token_create, operator_tokens_named_set_revoked


class Command(BaseCommand):
    help = (
        "Create an operator token (acts as a human operator: approve holds, set policy), "
        "or revoke or restore the tokens of a name."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who or what the token is for, e.g. 'alice-laptop'.")
        change = parser.add_mutually_exclusive_group()
        change.add_argument(
            "--revoke",
            action="store_true",
            help="Revoke every token of this name: its next request is answered 401.",
        )
        change.add_argument(
            "--restore",
            action="store_true",
            help="Restore the revoked token of this name (refused when several are revoked).",
        )

    def handle(self, *args: Any, name: str, revoke: bool, restore: bool, **options: Any) -> None:
        if revoke or restore:
            self._set_revoked(name, revoked=revoke)
            return
        try:
            token = operator_token_create(name=name, actor=command_line_operator())
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(f"Operator token {name!r} created. It is shown once; keep it secret.")
        self.stdout.write(token)

    def _set_revoked(self, name: str, *, revoked: bool) -> None:
        try:
            changed, named = operator_tokens_named_set_revoked(
                name=name, revoked=revoked, actor=command_line_operator()
            )
        except SwitchboardError as exc:
            raise CommandError(exc.detail) from exc
        verb = "revoked" if revoked else "restored"
        self.stdout.write(
            f"{changed} operator token(s) named {name!r} {verb}"
            + (f"; {named - changed} already were." if changed < named else ".")
        )
