"""Who is an operator (a staff user) changes only with an audit row, whichever surface changes it:
`operator_create`, the Django admin's user pages, Django's own `createsuperuser` and
`changepassword`, or code that saves a user.

Given a superuser logged in to the real admin pages, when it makes a user staff, gives or takes
admin rights, deactivates, renames, sets a password for, takes staff status from, or deletes an
operator, then one audit event names the change and the logged-in operator as its actor; a user
who is no operator, a login, and a password hash upgraded at login write none."""

from __future__ import annotations

import getpass
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from messaging.models import AuditEvent

PASSWORD = "a-good-operator-passphrase"


@pytest.fixture
def root(db: None) -> Client:
    """A browser logged in to the admin as a superuser, `root` (made before the audit is read)."""
    user = get_user_model().objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.force_login(user)
    AuditEvent.objects.all().delete()
    return client


CLI_ACTOR = f"operator:manage.py:{getpass.getuser()}"  # whoever runs a management command


def _operator_events() -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (e.kind, e.actor, e.target, e.detail)
        for e in AuditEvent.objects.filter(kind__startswith="operator.").order_by("id")
    ]


def _change(client: Client, user: Any, **changes: Any) -> None:
    """Post the user's change page as the admin renders it, with `changes` (a checkbox: True/False)."""
    page = client.get(f"/admin/auth/user/{user.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    posted: dict[str, Any] = {}
    for name, field in form.fields.items():
        value = changes.get(name, form.initial.get(name))
        if hasattr(field.widget, "widgets"):  # a date and a time, posted apart
            posted[f"{name}_0"] = value.date().isoformat() if value else ""
            posted[f"{name}_1"] = value.time().isoformat() if value else ""
        elif value is True:
            posted[name] = "on"
        elif value is None or value is False:
            continue  # an unticked box is not posted
        elif isinstance(value, list):
            posted[name] = [getattr(v, "pk", v) for v in value]
        else:
            posted[name] = value
    answer = client.post(f"/admin/auth/user/{user.pk}/change/", posted)
    assert answer.status_code == 302, answer.context["adminform"].form.errors


def test_a_user_made_in_the_admin_becomes_an_operator_with_an_audit_row(root):
    added = root.post(
        "/admin/auth/user/add/",
        {"username": "bea", "usable_password": "true", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert added.status_code == 302
    bea = get_user_model().objects.get(username="bea")
    assert _operator_events() == []  # a user who is no operator: nothing about operators changed

    _change(root, bea, is_staff=True)

    assert _operator_events() == [
        ("operator.created", "operator:root", "operator:bea", {"admin": False, "active": True})
    ]


@pytest.fixture
def bea(root: Client) -> Any:
    """An operator `bea` without admin rights, made before the audit is read."""
    user = get_user_model().objects.create_user("bea", password=PASSWORD, is_staff=True)
    AuditEvent.objects.all().delete()
    return user


@pytest.mark.parametrize(
    ("changes", "kind", "detail"),
    [
        ({"is_superuser": True}, "operator.changed", {"changed": ["admin"], "admin": True, "active": True}),
        ({"is_active": False}, "operator.changed", {"changed": ["active"], "admin": False, "active": False}),
        ({"is_staff": False}, "operator.removed", {"admin": False, "active": True}),
    ],
)
def test_changing_an_operator_in_the_admin_is_audited(root, bea, changes, kind, detail):
    _change(root, bea, **changes)
    assert _operator_events() == [(kind, "operator:root", "operator:bea", detail)]


def test_renaming_an_operator_in_the_admin_is_audited_under_both_names(root, bea):
    _change(root, bea, username="bea2")
    assert _operator_events() == [
        (
            "operator.changed",
            "operator:root",
            "operator:bea2",
            {"changed": ["name"], "admin": False, "active": True, "was": "operator:bea"},
        )
    ]


def test_a_save_that_changes_nothing_about_the_operator_writes_nothing(root, bea):
    _change(root, bea, first_name="Bea")
    assert _operator_events() == []


def test_setting_or_disabling_an_operators_password_in_the_admin_is_audited(root, bea):
    page = f"/admin/auth/user/{bea.pk}/password/"
    set_ = root.post(
        page, {"usable_password": "true", "password1": PASSWORD + "!", "password2": PASSWORD + "!"}
    )
    assert set_.status_code == 302
    disabled = root.post(page, {"usable_password": "false", "unset-password": "1"})
    assert disabled.status_code == 302
    assert not get_user_model().objects.get(pk=bea.pk).has_usable_password()
    changed = ("operator.changed", "operator:root", "operator:bea")
    assert _operator_events() == [
        (*changed, {"changed": ["password"], "admin": False, "active": True}),
        (*changed, {"changed": ["password"], "admin": False, "active": True}),
    ]


def test_deleting_an_operator_in_the_admin_is_audited(root, bea):
    answer = root.post(f"/admin/auth/user/{bea.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302
    assert _operator_events() == [
        ("operator.deleted", "operator:root", "operator:bea", {"admin": False, "active": True})
    ]


def test_deleting_operators_in_bulk_in_the_admin_audits_each(root, bea):
    cy = get_user_model().objects.create_user("cy", password=PASSWORD, is_staff=True)
    AuditEvent.objects.all().delete()
    answer = root.post(
        "/admin/auth/user/", {"action": "delete_selected", "_selected_action": [bea.pk, cy.pk], "post": "yes"}
    )
    assert answer.status_code == 302
    assert sorted((kind, actor, target) for kind, actor, target, _ in _operator_events()) == [
        ("operator.deleted", "operator:root", "operator:bea"),
        ("operator.deleted", "operator:root", "operator:cy"),
    ]


def test_operator_create_writes_one_row_and_a_reset_another(db, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_OPERATOR_PASSWORD", PASSWORD)
    call_command("operator_create", "ada", stdout=StringIO())
    call_command("operator_create", "ada", "--no-admin", stdout=StringIO())
    assert _operator_events() == [
        ("operator.created", CLI_ACTOR, "operator:ada", {"admin": True, "active": True}),
        (
            "operator.changed",
            CLI_ACTOR,
            "operator:ada",
            {"changed": ["admin", "password"], "admin": False, "active": True},
        ),
    ]


def test_djangos_own_commands_are_audited_as_the_account_that_ran_them(transactional_db, monkeypatch):
    """`createsuperuser` and `changepassword` change who can log in as an operator, from the shell
    (`switchboard manage`; `manage.py` runs the same). Django closes the database connections when
    a command ends, so the test runs outside a wrapping transaction."""
    from hub.cli import run_manage

    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", PASSWORD)
    assert run_manage(["createsuperuser", "--no-input", "--username", "dee", "--email", ""]) == 0
    monkeypatch.setattr("getpass.getpass", lambda prompt="": PASSWORD + "?")
    assert run_manage(["changepassword", "dee"]) == 0
    assert _operator_events() == [
        ("operator.created", CLI_ACTOR, "operator:dee", {"admin": True, "active": True}),
        (
            "operator.changed",
            CLI_ACTOR,
            "operator:dee",
            {"changed": ["password"], "admin": True, "active": True},
        ),
    ]


def test_a_login_and_a_password_hash_upgraded_at_login_are_no_change(db, settings):
    """Django saves the user at each login (`last_login`) and re-hashes a password stored with an
    older hasher; neither changes who is an operator."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_user_model().objects.create_user("eve", password=PASSWORD, is_staff=True)
    AuditEvent.objects.filter(kind__startswith="operator.").delete()
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.MD5PasswordHasher",
    ]

    assert Client().post("/login/", {"username": "eve", "password": PASSWORD}).status_code == 302

    assert get_user_model().objects.get(username="eve").password.startswith("pbkdf2_")  # upgraded
    assert _operator_events() == []
