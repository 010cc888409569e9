"""`switchboard manage operator_token NAME --revoke` / `--restore`: an operator without the Django
admin (`operator_create --no-admin`) ends a leaked operator token from the hub's shell, through
the same audited service as the admin's actions, and an unknown or ambiguous name changes nothing."""

from __future__ import annotations

import getpass
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from messaging.models import AuditEvent, OperatorToken
from messaging.principals import HUB
from messaging.services.operator_tokens import operator_token_create

CLI_ACTOR = f"operator:manage.py:{getpass.getuser()}"  # whoever runs the command, never "hub"


def _run(*args: str) -> str:
    out = StringIO()
    call_command("operator_token", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_revoking_and_restoring_by_name_takes_effect_and_is_audited(api, operator_token):
    assert api.get("audit", operator_token).status_code == 200

    assert "revoked" in _run("test-operator", "--revoke")
    assert api.get("audit", operator_token).status_code == 401
    assert AuditEvent.objects.filter(
        kind="operator_token.revoked", actor=CLI_ACTOR, target="test-operator"
    ).exists()

    assert "restored" in _run("test-operator", "--restore")
    assert api.get("audit", operator_token).status_code == 200
    assert AuditEvent.objects.filter(
        kind="operator_token.restored", actor=CLI_ACTOR, target="test-operator"
    ).exists()


def test_minting_a_token_is_audited_as_the_account_that_ran_the_command(db):
    _run("ops-laptop")
    assert list(AuditEvent.objects.filter(kind="operator_token.created").values_list("actor", "target")) == [
        (CLI_ACTOR, "ops-laptop")
    ]


def test_revoking_a_name_revokes_every_token_of_that_name(db):
    first, second = operator_token_create(name="ci", actor=HUB), operator_token_create(name="ci", actor=HUB)
    assert first != second
    assert "2 operator token(s) named 'ci' revoked" in _run("ci", "--revoke")
    assert set(OperatorToken.objects.filter(name="ci").values_list("revoked", flat=True)) == {True}
    assert "already" in _run("ci", "--revoke")  # nothing left to change, and nothing audited again
    assert AuditEvent.objects.filter(kind="operator_token.revoked").count() == 2


@pytest.mark.parametrize("verb", ["--revoke", "--restore"])
def test_an_unknown_name_is_an_error_that_changes_nothing(db, verb):
    operator_token_create(name="ci", actor=HUB)
    with pytest.raises(CommandError, match="No operator token is named 'nobody'"):
        _run("nobody", verb)
    assert not OperatorToken.objects.filter(revoked=True).exists()
    assert not AuditEvent.objects.filter(kind__startswith="operator_token.r").exists()


def test_restoring_is_refused_when_several_revoked_tokens_share_the_name(db):
    """Restoring one of two revoked tokens by name would be a guess (one may have leaked)."""
    operator_token_create(name="ci", actor=HUB)
    operator_token_create(name="ci", actor=HUB)
    _run("ci", "--revoke")
    with pytest.raises(CommandError, match="2 revoked operator tokens are named 'ci'"):
        _run("ci", "--restore")
    assert set(OperatorToken.objects.filter(name="ci").values_list("revoked", flat=True)) == {True}


def test_revoke_and_restore_together_are_refused(db):
    operator_token_create(name="ci", actor=HUB)
    with pytest.raises(CommandError):
        _run("ci", "--revoke", "--restore")
    assert not OperatorToken.objects.filter(revoked=True).exists()
