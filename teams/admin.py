from django.contrib import admin

from teams.models import FrameRequest, GateCheck, Membership, Observer, QualityGate, Subscription, Task, Team


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "lead_session", "created_at", "ended_at")
    search_fields = ("name", "id")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "team", "role", "session", "joined_at", "left_at")
    list_filter = ("role",)


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "team", "status", "owner", "revision", "gate_pending")
    list_filter = ("status",)


@admin.register(FrameRequest)
class FrameRequestAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "team", "state", "created_at", "expires_at")
    list_filter = ("kind", "state")


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("id", "subscriber", "target", "state", "expires_at", "fired_on")


@admin.register(QualityGate)
class QualityGateAdmin(admin.ModelAdmin):
    list_display = ("team", "event", "url", "fail_closed")


@admin.register(GateCheck)
class GateCheckAdmin(admin.ModelAdmin):
    list_display = ("id", "team", "event", "state", "attempts", "decided_at")


@admin.register(Observer)
class ObserverAdmin(admin.ModelAdmin):
    list_display = ("session", "target_session", "target_team", "created_at")
