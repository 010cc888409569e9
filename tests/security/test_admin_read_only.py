"""The Django admin changes nothing that has rules: every change goes through its service, which
checks the rules and writes the audit (docs/architecture.md, "Services are the only writers").

Given a superuser logged in to the real admin pages, when it posts an edit, a delete or an add for
any row of a Switchboard model, then the admin refuses (403) and the row is as it was; the list and
detail pages still answer. Removing a pin and revoking or restoring an operator token are admin
actions that call the service as that operator (`operator_token NAME --revoke` does the latter
from the command line)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin as django_admin
from django.contrib.auth import get_user_model
from django.db import models
from django.forms.models import model_to_dict
from django.test import Client
from django.utils import timezone

from messaging.models import AgentSession, AuditEvent, Delivery, OperatorToken, Pin, SenderPolicy
from teams.models import (
    FrameRequest,
    GateCheck,
    Membership,
    Observer,
    QualityGate,
    Role,
    Subscription,
    Task,
    Team,
)
from tests.teams import conftest as team_fixtures

crew = team_fixtures.crew  # a lead with a team and two teammates, alice and bob

SWITCHBOARD_APPS = {"messaging", "teams", "federation", "alerts", "console"}


@pytest.fixture
def root(db: None) -> Client:
    """A browser logged in to the admin as a superuser."""
    user = get_user_model().objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def rows(api: Any, crew: Any, register: Any, send: Any, operator_token: str) -> dict[str, tuple[Any, dict]]:
    """One row of each model the admin shows, and an edit that would break one of its rules:
    {admin path: (row, fields to post)}. The team's rows come from the API; the gate, its check,
    the request, the subscription and the observer are written directly, as fixtures, since
    making them through their services needs a hook server or a frame exchange."""
    team = Team.objects.get(pk=crew.team_id)
    alice = Membership.objects.get(pk=crew.members["alice"])
    lead = Membership.objects.get(pk=crew.members["lead-one"])
    made = api.post(crew.path("/tasks"), crew.lead.token, {"title": "Orders schema"})
    assert made.status_code == 201, made.json_body
    task = Task.objects.get(pk=made.json_body["id"])
    assert send(crew.alice, "bob", "hello").status_code == 201  # reaching a name pins it
    pin = Pin.objects.get(sender_id=crew.alice.id)
    gate = QualityGate.objects.create(team=team, event="task_completed", url="https://gate.example/hook")
    check = GateCheck.objects.create(gate=gate, team=team, event="task_completed", task=task)
    request = FrameRequest.objects.create(
        team=team,
        kind="plan_approval",
        requester=alice,
        responder=lead,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    stranger = AgentSession.objects.get(pk=register("stranger").id)
    subscription = Subscription.objects.create(
        subscriber=stranger, target_id=crew.alice.id, expires_at=timezone.now() + timedelta(hours=1)
    )
    observer = Observer.objects.create(
        session=stranger, target_session_id=crew.bob.id, registered_by="operator:x"
    )
    loopback = "http://127.0.0.1:9/hook"  # an address the gate's service refuses at set time
    return {
        "teams/team": (team, {"lead_session": crew.alice.id}),
        "teams/membership": (alice, {"role": Role.LEAD}),
        "teams/task": (task, {"status": "completed", "owner": alice.pk}),
        "teams/framerequest": (request, {"state": "approved"}),
        "teams/subscription": (subscription, {"state": "lapsed"}),
        "teams/qualitygate": (gate, {"url": loopback, "fail_closed": ""}),
        "teams/gatecheck": (check, {"state": "accepted"}),
        "teams/observer": (observer, {"target_session": crew.lead.id}),
        "messaging/pin": (pin, {"recipient": crew.lead.id}),
        "messaging/operatortoken": (OperatorToken.objects.get(name="test-operator"), {"revoked": "on"}),
        "messaging/agentsession": (
            AgentSession.objects.get(pk=crew.bob.id),
            {"operator_policy": "accept", "status": "exited"},
        ),
        "messaging/delivery": (
            Delivery.objects.filter(recipient_id=crew.bob.id).latest("id"),
            {"state": "read"},
        ),
        "messaging/senderpolicy": (
            SenderPolicy.objects.create(recipient_id=crew.bob.id, sender_id=crew.alice.id, action="hold"),
            {"action": "accept"},
        ),
        "messaging/auditevent": (AuditEvent.objects.order_by("id").first(), {"kind": "forged"}),
    }


def _as_posted(value: Any) -> Any:
    if value is None or value is False:
        return ""
    if value is True:
        return "on"
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, list):
        return [_as_posted(v) for v in value]
    return value


def _edit(client: Client, path: str, row: Any, changes: dict[str, Any]) -> dict[str, Any]:
    """What the change page would post for `row` with `changes`: the form's own initial values
    (so, before this admin was read-only, a valid edit that saved), then the changes."""
    page = client.get(f"/admin/{path}/{row.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    posted: dict[str, Any] = {}
    for name, field in form.fields.items():
        value = form.initial.get(name)
        if hasattr(field.widget, "widgets"):  # a date and a time, posted apart
            posted[f"{name}_0"] = value.date().isoformat() if value else ""
            posted[f"{name}_1"] = value.time().isoformat() if value else ""
        else:
            posted[name] = _as_posted(value)
    return {**posted, **changes}


def _state(row: Any) -> dict[str, Any]:
    fresh = type(row).objects.get(pk=row.pk)
    return {k: v for k, v in model_to_dict(fresh).items()}


@pytest.mark.parametrize(
    "path",
    [
        "teams/team",
        "teams/membership",
        "teams/task",
        "teams/framerequest",
        "teams/subscription",
        "teams/qualitygate",
        "teams/gatecheck",
        "teams/observer",
        "messaging/pin",
        "messaging/operatortoken",
        "messaging/agentsession",
        "messaging/delivery",
        "messaging/senderpolicy",
        "messaging/auditevent",
    ],
)
def test_the_admin_refuses_to_add_change_or_delete_a_row_with_rules(root, rows, path):
    row, changes = rows[path]
    before = _state(row)

    assert root.post(f"/admin/{path}/{row.pk}/change/", _edit(root, path, row, changes)).status_code == 403
    assert root.post(f"/admin/{path}/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert root.get(f"/admin/{path}/add/").status_code == 403
    assert root.post(f"/admin/{path}/add/", {}).status_code == 403
    bulk = root.post(
        f"/admin/{path}/", {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"}
    )
    assert bulk.status_code in (200, 302)

    assert _state(row) == before


def test_the_list_and_detail_pages_still_answer(root, rows):
    for path, (row, _) in rows.items():
        listing = root.get(f"/admin/{path}/")
        assert listing.status_code == 200, path
        page = root.get(f"/admin/{path}/{row.pk}/change/")
        assert page.status_code == 200, path
        assert b'name="_save"' not in page.content, path  # shown, with nothing to save


def test_no_switchboard_model_in_the_admin_may_be_added_changed_or_deleted(db):
    """Every registration of a Switchboard app, present and future, is read-only for a superuser;
    Django's own users and groups (the operators' logins) stay editable."""
    user = get_user_model()(username="root", is_staff=True, is_superuser=True, is_active=True)

    class Request:
        pass

    request = Request()
    request.user = user  # type: ignore[attr-defined]
    writable = [
        f"{model._meta.label}: {verb}"
        for model, model_admin in django_admin.site._registry.items()
        if model._meta.app_label in SWITCHBOARD_APPS
        for verb in ("add", "change", "delete")
        if getattr(model_admin, f"has_{verb}_permission")(request)
    ]
    assert writable == []
    assert get_user_model() in django_admin.site._registry


def test_removing_a_pin_in_the_admin_goes_through_the_service_and_is_audited(root, rows, send, crew):
    pin, _ = rows["messaging/pin"]
    answer = root.post("/admin/messaging/pin/", {"action": "pins_remove", "_selected_action": [pin.pk]})
    assert answer.status_code == 302
    assert not Pin.objects.filter(pk=pin.pk).exists()
    event = AuditEvent.objects.get(kind="pin.removed")
    assert event.actor == "operator:root" and event.target == str(crew.alice.id)
    assert event.detail == {"name_key": pin.name_key, "recipient": str(crew.bob.id)}


def test_revoking_and_restoring_an_operator_token_in_the_admin_is_audited_and_takes_effect(
    root, api, operator_token
):
    row = OperatorToken.objects.get(name="test-operator")
    assert api.get("audit", operator_token).status_code == 200

    revoked = root.post(
        "/admin/messaging/operatortoken/", {"action": "tokens_revoke", "_selected_action": [row.pk]}
    )
    assert revoked.status_code == 302
    assert AuditEvent.objects.filter(
        kind="operator_token.revoked", actor="operator:root", target="test-operator"
    ).exists()
    assert api.get("audit", operator_token).status_code == 401

    restored = root.post(
        "/admin/messaging/operatortoken/", {"action": "tokens_restore", "_selected_action": [row.pk]}
    )
    assert restored.status_code == 302
    assert AuditEvent.objects.filter(kind="operator_token.restored", actor="operator:root").exists()
    assert api.get("audit", operator_token).status_code == 200
