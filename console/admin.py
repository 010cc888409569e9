"""The Django admin's pages for the operators' own accounts: Django's users, with every change
audited as the logged-in operator (`messaging.services.operators`, which audits a change to a
user wherever it is made; here it learns who made it)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest, HttpResponse

from messaging.admin import operator_of
from messaging.services.operators import operator_accounts_changed_by

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
