"""Django admin for the messaging models: raw access for operators who want it.

Changes that have rules (delivery states, policy, holds) belong to the services and the console;
here the rows that record history (messages, deliveries, audit) are read-only, so the admin cannot
move a delivery around its state machine or rewrite what was said.

A message's text and summary are shown here as the console shows them: a sensitive message's
secrets masked (`mask_text`), revealed only on the console's message page, which audits the reveal."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from messaging.models import (
    AgentSession,
    AuditEvent,
    Delivery,
    Message,
    OperatorToken,
    Pin,
    SenderPolicy,
    Tier,
)
from messaging.sensitivity import mask_text


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
    search_fields = ("id", "to_label", "sender__name", "sender__ref")
    list_select_related = ("sender",)
    date_hierarchy = "created_at"
    # A sensitive message's text and summary reach the page only masked, and no filter on either
    # and no search of a sensitive summary is answered: each would confirm a masked secret a few
    # characters at a time.
    exclude = ("request_hash", "text", "summary")
    readonly_fields = ("shown_summary", "shown_text")
    HIDDEN = frozenset({"text", "summary"})

    @admin.display(description="summary")
    def shown_summary(self, message: Message) -> str:
        return mask_text(message.summary) if message.tier == Tier.SENSITIVE else message.summary

    @admin.display(description="text")
    def shown_text(self, message: Message) -> str:
        if message.tier != Tier.SENSITIVE:
            return message.text
        page = reverse("console:message", args=[message.pk])
        return format_html(
            '{}<br><a href="{}">Reveal it on the console\'s message page</a> (audited).',
            mask_text(message.text),
            page,
        )

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        if lookup.split("__", 1)[0] in self.HIDDEN:
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Message], search_term: str
    ) -> tuple[QuerySet[Message], bool]:
        """Searches summaries too, those of messages outside the sensitive tier only."""
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if search_term.strip():
            plain = queryset.exclude(tier=Tier.SENSITIVE).filter(summary__icontains=search_term.strip())
            found = found | plain
        return found, may_have_duplicates


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
