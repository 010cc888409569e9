"""The Django admin's pages for the operators' own accounts: Django's users, with every change
audited as the logged-in operator (`messaging.services.operators`, which audits a change to a
user wherever it is made; here it learns who made it), and django-axes' login lockouts, read-only,
with an unlock action that calls the audited service (registered here, not by axes:
`AXES_ENABLE_ADMIN = False`)."""

from __future__ import annotations

from typing import Any

from axes import admin as axes_admin
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from messaging.admin import ReadOnlyAdmin, operator_of
from messaging.services.operators import operator_accounts_changed_by, operator_unlock

User = get_user_model()


class OperatorUserAdmin(UserAdmin):
    """Django's user admin, unchanged but for the actor of its audit: each view that writes a user
    (add and change, password, delete, the list's bulk actions) runs as the logged-in operator."""

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with operator_accounts_changed_by(operator_of(request)):
            return super().changeform_view(request, *args, **kwargs)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with operator_accounts_changed_by(operator_of(request)):
            return super().delete_view(request, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with operator_accounts_changed_by(operator_of(request)):
            return super().changelist_view(request, *args, **kwargs)

    def user_change_password(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with operator_accounts_changed_by(operator_of(request)):
            return super().user_change_password(request, *args, **kwargs)


admin.site.unregister(User)
admin.site.register(User, OperatorUserAdmin)


@admin.register(AccessAttempt)
class AccessAttemptAdmin(ReadOnlyAdmin, axes_admin.AccessAttemptAdmin):
    """The failed logins counted per username. A row is the lockout itself, so none is edited or
    deleted here (that would unlock with no audit); unlocking is the action, as `operator_unlock`
    on the command line."""

    actions = ("attempts_unlock",)

    @admin.action(description="Unlock the logins of the selected usernames (audited)")
    def attempts_unlock(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        actor = operator_of(request)
        names = sorted(set(queryset.values_list("username", flat=True)))
        for name in names:
            operator_unlock(name=name, actor=actor)
        self.message_user(request, f"{len(names)} login(s) unlocked.", messages.SUCCESS)


@admin.register(AccessLog)
class AccessLogAdmin(ReadOnlyAdmin, axes_admin.AccessLogAdmin):
    """Logins and logouts, as recorded: a record is never edited."""


@admin.register(AccessFailureLog)
class AccessFailureLogAdmin(ReadOnlyAdmin, axes_admin.AccessFailureLogAdmin):
    """Failed logins, as recorded: a record is never edited."""
