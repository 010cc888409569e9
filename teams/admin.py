"""Django admin for the teams models: read-only, like messaging's (`ReadOnlyAdmin`).

A roster, a lead, a task's status, a gate's URL, an observer: each has rules that its service in
`teams/services/` checks and audits (who may join, one lead per team, compare-and-set on a task,
the outbound address check on a gate's URL, only an operator lifts an observer). The admin shows
these rows and changes none; operators change them through the API (`/api/v1/teams/...`, with an
operator token or the console's login), which calls those services."""

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from messaging.admin import ReadOnlyAdmin
from messaging.principals import operator_principal
from teams.models import FrameRequest, GateCheck, Membership, Observer, QualityGate, Subscription, Task, Team
from teams.services.frames import request_summaries


@admin.register(Team)
class TeamAdmin(ReadOnlyAdmin):
    list_display = ("name", "id", "lead_session", "created_at", "ended_at")
    search_fields = ("name", "id")


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ("name", "id", "team", "role", "session", "joined_at", "left_at")
    list_filter = ("role",)


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "title", "team", "status", "owner", "revision", "gate_pending")
    list_filter = ("status",)


@admin.register(FrameRequest)
class FrameRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "team", "state", "created_at", "expires_at")
    list_filter = ("kind", "state")
    # A request's payload and reason are the text of the frames that carried them: shown as an
    # operator reads them through the API (`request_summaries`, masked when that frame is in the
    # sensitive tier), never as form fields, and never filtered on, which would confirm a masked
    # secret a few characters at a time.
    exclude = ("payload", "reason")
    readonly_fields = ("shown_payload", "shown_reason")
    HIDDEN = frozenset({"payload", "reason"})

    @staticmethod
    def _as_operators_read_it(request: FrameRequest) -> dict[str, Any]:
        [summary] = request_summaries([request], viewer=operator_principal("admin"))
        return summary

    @admin.display(description="payload")
    def shown_payload(self, request: FrameRequest) -> str:
        return json.dumps(self._as_operators_read_it(request)["payload"], ensure_ascii=False, indent=2)

    @admin.display(description="reason")
    def shown_reason(self, request: FrameRequest) -> str:
        return str(self._as_operators_read_it(request)["reason"])

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        if lookup.split("__", 1)[0] in self.HIDDEN:
            return False
        return super().lookup_allowed(lookup, value, request)


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ("id", "subscriber", "target", "state", "expires_at", "fired_on")


@admin.register(QualityGate)
class QualityGateAdmin(ReadOnlyAdmin):
    list_display = ("team", "event", "url", "fail_closed")


@admin.register(GateCheck)
class GateCheckAdmin(ReadOnlyAdmin):
    list_display = ("id", "team", "event", "state", "attempts", "decided_at")


@admin.register(Observer)
class ObserverAdmin(ReadOnlyAdmin):
    list_display = ("session", "target_session", "target_team", "created_at")
