"""Django admin for the messaging models: raw access for operators who want it.

Changes that have rules (delivery states, policy, holds) belong to the services and the console;
here the rows that record history (messages, deliveries, audit) are read-only, so the admin cannot
move a delivery around its state machine or rewrite what was said."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from messaging.models import (
    AgentSession,
    AuditEvent,
    Delivery,
    Message,
    OperatorToken,
    Pin,
    SenderPolicy,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Browse and search, never add, change or delete: these rows are the record."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AgentSession)
class AgentSessionAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "ref",
        "status",
        "kind",
        "permission_mode",
        "operator_policy",
        "inbound_policy",
        "last_seen",
    )
    list_filter = ("status", "kind", "permission_mode", "headless")
    search_fields = ("name", "ref", "cwd", "id")
    exclude = ("token_hash",)
    ordering = ("-last_seen",)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "sender", "to_label", "kind", "tier", "trust", "priority", "size", "created_at")
    list_filter = ("kind", "tier", "trust", "priority")
    search_fields = ("id", "to_label", "summary", "sender__name", "sender__ref")
    list_select_related = ("sender",)
    date_hierarchy = "created_at"
    exclude = ("request_hash",)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "message",
        "recipient",
        "state",
        "tier",
        "hold_reason",
        "escalate",
        "expires_at",
        "updated_at",
    )
    list_filter = ("state", "tier", "hold_reason", "escalate")
    search_fields = ("message__id", "recipient__name", "recipient__ref", "decided_by")
    list_select_related = ("message", "recipient")


@admin.register(Pin)
class PinAdmin(admin.ModelAdmin):
    """Pins may be removed (a sender then resolves the name afresh); they cannot be invented here."""

    list_display = ("sender", "name_key", "recipient", "updated_at")
    search_fields = ("name_key", "sender__name", "recipient__name")
    list_select_related = ("sender", "recipient")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(SenderPolicy)
class SenderPolicyAdmin(ReadOnlyAdmin):
    """Set these from the session page of the console, which audits and announces the change."""

    list_display = ("recipient", "sender", "action", "by_operator", "set_by", "created_at")
    list_filter = ("action", "by_operator")
    list_select_related = ("recipient", "sender")


@admin.register(OperatorToken)
class OperatorTokenAdmin(admin.ModelAdmin):
    """Tokens are minted by `manage.py operator_token`; here they can only be seen and revoked."""

    list_display = ("name", "created_at", "last_used", "revoked")
    list_filter = ("revoked",)
    fields = ("name", "created_at", "last_used", "revoked")
    readonly_fields = ("name", "created_at", "last_used")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: OperatorToken, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if "revoked" in form.changed_data:
            from messaging.services.audit import audit_event

            audit_event(
                "operator_token.revoked" if obj.revoked else "operator_token.restored",
                actor=f"operator:{request.user.get_username()}",
                target=obj.name,
            )


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "at", "kind", "actor", "target", "message_id", "delivery_id", "length")
    list_filter = ("kind",)
    search_fields = ("kind", "actor", "target", "message_id")
    date_hierarchy = "at"
