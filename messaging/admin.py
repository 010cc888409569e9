"""Django admin for the messaging models: raw, read-only access for operators who want it.

Every change that has rules (delivery states, policy, holds, pins, tokens) belongs to a service
(`messaging/services/`), which checks the rules and writes the audit. So no row here can be added,
changed or deleted through the admin's forms (`ReadOnlyAdmin`); removing a pin and revoking or
restoring an operator token (also `operator_token NAME --revoke`) are admin actions that call their
service with the operator as the actor.

A message's text and summary are shown here as the console shows them: a sensitive message's
secrets masked (`mask_text`), revealed only on the console's message page, which audits the reveal
(linked through `PLUGINS.message_page`, which the console registers: this floor names no page of
the floors above)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
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
from messaging.plugins import PLUGINS
from messaging.principals import Principal, operator_principal
from messaging.sensitivity import mask_text
from messaging.services.operator_tokens import operator_token_restore, operator_token_revoke
from messaging.services.pins import pin_remove


class ReadOnlyAdmin(admin.ModelAdmin):
    """Browse and search, never add, change or delete: a row here is either the record (messages,
    deliveries, the audit) or state that only its service may change. Django's bulk delete goes
    with the delete permission. Actions a subclass declares are the only way to change anything,
    and each calls a service as the operator (`operator_of`)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def operator_of(request: HttpRequest) -> Principal:
    """The logged-in staff user as the operator a service acts for (named so in the audit), as the
    console's and the API's logins are."""
    return operator_principal(request.user.get_username())


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
        page = PLUGINS.message_page(message.pk)
        if page is None:
            return mask_text(message.text)
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
class PinAdmin(ReadOnlyAdmin):
    """A pin is written by a send; an operator may remove one (the sender's next send resolves the
    name afresh), through `pin_remove`, which audits it. Never invented or re-pointed here."""

    list_display = ("sender", "name_key", "recipient", "updated_at")
    search_fields = ("name_key", "sender__name", "recipient__name")
    list_select_related = ("sender", "recipient")
    actions = ("pins_remove",)

    @admin.action(description="Remove the selected pins (audited)")
    def pins_remove(self, request: HttpRequest, queryset: QuerySet[Pin]) -> None:
        actor = operator_of(request)
        removed = sum(pin_remove(pin_id=pk, actor=actor) for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"{removed} pin(s) removed.", messages.SUCCESS)


@admin.register(SenderPolicy)
class SenderPolicyAdmin(ReadOnlyAdmin):
    """Set these from the session page of the console, which audits and announces the change."""

    list_display = ("recipient", "sender", "action", "by_operator", "set_by", "created_at")
    list_filter = ("action", "by_operator")
    list_select_related = ("recipient", "sender")


@admin.register(OperatorToken)
class OperatorTokenAdmin(ReadOnlyAdmin):
    """Tokens are minted by `switchboard manage operator_token NAME`; here they are seen, and
    revoked or restored through their service, which audits each change."""

    list_display = ("name", "created_at", "last_used", "revoked")
    list_filter = ("revoked",)
    fields = ("name", "created_at", "last_used", "revoked")
    actions = ("tokens_revoke", "tokens_restore")

    @admin.action(description="Revoke the selected operator tokens (audited)")
    def tokens_revoke(self, request: HttpRequest, queryset: QuerySet[OperatorToken]) -> None:
        actor = operator_of(request)
        done = sum(
            operator_token_revoke(token_id=pk, actor=actor) for pk in queryset.values_list("pk", flat=True)
        )
        self.message_user(request, f"{done} token(s) revoked.", messages.SUCCESS)

    @admin.action(description="Restore the selected operator tokens (audited)")
    def tokens_restore(self, request: HttpRequest, queryset: QuerySet[OperatorToken]) -> None:
        actor = operator_of(request)
        done = sum(
            operator_token_restore(token_id=pk, actor=actor) for pk in queryset.values_list("pk", flat=True)
        )
        self.message_user(request, f"{done} token(s) restored.", messages.SUCCESS)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "at", "kind", "actor", "target", "message_id", "delivery_id", "length")
    list_filter = ("kind",)
    search_fields = ("kind", "actor", "target", "message_id")
    date_hierarchy = "at"
