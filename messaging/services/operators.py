"""Operator accounts: who is an operator, and each change to that, audited.

An operator is a staff user of Django's auth (`is_staff`; `is_superuser` adds the Django admin).
Users are changed in several places, some of them Django's own: `operator_create`, the Django
admin's user pages, `createsuperuser` and `changepassword`, a shell. So the audit is written
where every one of them passes: the user model's save and delete signals (`connect`, from
`MessagingConfig.ready`), in the same transaction as the change when the caller has one (the
admin's views and `operator_create` do). A surface that knows who acts names the operator with
`operator_accounts_changed_by`: the admin's views name the logged-in operator, management commands
(`switchboard manage`, `operator_create`) the account that runs them (`command_line_operator`);
any other change is the hub's (`actor="hub"`). A bulk `QuerySet.update` sends no signal and is not seen:
nothing in the hub changes users that way.

Unlocking a login (django-axes' lockout) is an operator's change too: `operator_unlock`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from axes.utils import reset
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save

from messaging.principals import HUB, Principal
from messaging.services.audit import audit_event

# Who changes users in this context: the admin sets it to the logged-in operator for its views.
_changed_by: ContextVar[Principal] = ContextVar("operator_accounts_changed_by", default=HUB)

# The user model's fields that decide who is an operator and how it logs in; a save that writes
# none of them (`update_fields=["last_login"]` at each login) is not looked at.
ACCOUNT_FIELDS = frozenset({"username", "is_staff", "is_superuser", "is_active", "password"})


@dataclass(frozen=True)
class Account:
    """What makes a user an operator, as stored."""

    name: str
    staff: bool
    admin: bool
    active: bool
    password: str  # the hash

    @classmethod
    def of(cls, user: Any) -> Account:
        return cls(user.get_username(), user.is_staff, user.is_superuser, user.is_active, user.password)

    @property
    def detail(self) -> dict[str, Any]:
        return {"admin": self.admin, "active": self.active}


def operator_account_change(
    before: Account | None, after: Account, *, password_set: bool
) -> tuple[str, dict[str, Any]] | None:
    """The audit event (kind, detail) for a user saved as `after` that was `before` (None: new),
    or None when nothing about an operator changed. `password_set`: the hash changed because a
    password was set or disabled, not re-hashed at login (Django's own distinction)."""
    if not after.staff:
        return ("operator.removed", after.detail) if before is not None and before.staff else None
    if before is None or not before.staff:
        return "operator.created", after.detail
    changed = [
        label
        for label, differs in (
            ("admin", before.admin != after.admin),
            ("active", before.active != after.active),
            ("name", before.name != after.name),
            ("password", before.password != after.password and password_set),
        )
        if differs
    ]
    if not changed:
        return None
    detail = {"changed": changed, **after.detail}
    if before.name != after.name:
        detail["was"] = f"operator:{before.name}"
    return "operator.changed", detail


@contextmanager
def operator_accounts_changed_by(actor: Principal) -> Iterator[None]:
    """Within the block, changes to users are audited with `actor` (the admin's logged-in operator)."""
    token = _changed_by.set(actor)
    try:
        yield
    finally:
        _changed_by.reset(token)


def operator_unlock(*, name: str, actor: Principal) -> int:
    """Lift the login lockout of username `name` at once (django-axes' failed attempts for it are
    forgotten), audited. Returns how many failed attempts were recorded."""
    with transaction.atomic():
        cleared = reset(username=name)
        audit_event(
            "operator.unlocked", actor=actor.actor, target=f"operator:{name}", detail={"attempts": cleared}
        )
    return cleared


# Django's user model, on each save and delete. The stored account is read before the save, so
# the event compares what was stored with what is written.
_BEFORE = "_switchboard_account_before"


def _user_saving(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    instance.__dict__.pop(_BEFORE, None)
    if update_fields is not None and not ACCOUNT_FIELDS & set(update_fields):
        return
    stored = sender.objects.filter(pk=instance.pk).first() if instance.pk is not None else None
    instance.__dict__[_BEFORE] = Account.of(stored) if stored is not None else None


def _user_saved(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    if _BEFORE not in instance.__dict__:
        return  # a save of no account field (see `_user_saving`)
    before = instance.__dict__.pop(_BEFORE)
    # Django's `set_password` keeps the raw password in `_password` until the save; the hash
    # upgrade at login clears it and saves `update_fields=["password"]`, and that save alone is
    # no change of password. A password disabled (`set_unusable_password`) is saved in full.
    upgraded = update_fields is not None and set(update_fields) == {"password"} and instance._password is None
    event = operator_account_change(before, Account.of(instance), password_set=not upgraded)
    if event is not None:
        kind, detail = event
        audit_event(
            kind, actor=_changed_by.get().actor, target=f"operator:{instance.get_username()}", detail=detail
        )


def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    account = Account.of(instance)
    if account.staff:
        audit_event(
            "operator.deleted",
            actor=_changed_by.get().actor,
            target=f"operator:{account.name}",
            detail=account.detail,
        )


def connect() -> None:
    """Audit every save and delete of a user (from `MessagingConfig.ready`)."""
    user_model = get_user_model()
    pre_save.connect(_user_saving, sender=user_model, dispatch_uid="messaging.operator_saving")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="messaging.operator_saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="messaging.operator_deleted")
