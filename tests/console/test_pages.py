"""The read-only pages: team roster and board, session detail, audit, admin; and the selectors
behind them (dead sessions, catch-up limits)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from console import selectors
from messaging.liveness import dead_sessions_q, session_liveness
from messaging.models import AgentSession, AuditEvent
from tests.teams.conftest import join_team


@pytest.fixture
def team(api, register):
    """A team `checkout` led by `lead1` with teammate `ui`, and three tasks: one claimed, one blocked."""
    lead, ui = register("lead1"), register("ui")
    made = api.post("teams", lead.token, {"name": "checkout"}).json_body
    join_team(api, lead, made["id"], ui)
    first = api.post(f"teams/{made['id']}/tasks", lead.token, {"title": "Schema <draft>"}).json_body
    api.post(f"teams/{made['id']}/tasks", lead.token, {"title": "Endpoints", "blocked_by": [first["id"]]})
    claimed = api.post(f"tasks/{first['id']}/claim", ui.token, {})
    assert claimed.status_code == 200, claimed.json_body
    return made, lead, ui


def test_the_team_page_shows_roster_and_board_by_column(team, operator_client):
    made, lead, ui = team
    page = operator_client.get(f"/teams/{made['id']}/")
    assert page.status_code == 200
    columns = dict((name, cards) for name, _label, cards in page.context["columns"])
    assert [c["task"].title for c in columns["in_progress"]] == ["Schema <draft>"]
    assert [(c["task"].title, c["blocked"]) for c in columns["pending"]] == [("Endpoints", True)]
    html = page.content.decode()
    assert "Schema &lt;draft&gt;" in html
    assert f"lead1 [{lead.ref}]" in html and f"ui [{ui.ref}]" in html


def test_the_dashboard_lists_live_teams_and_each_sessions_team(team, operator_client):
    made, lead, _ = team
    page = operator_client.get("/")
    assert [(t["name"], t["members"], t["open_tasks"]) for t in page.context["teams"]] == [("checkout", 2, 2)]
    rows = {s["name"]: s for s in page.context["sessions"]}
    assert rows["lead1"]["team"]["name"] == "checkout"
    assert rows["ui"]["team"]["role"] == "teammate"


def test_the_session_page_shows_pins_and_subscriptions(api, register, send, operator_client):
    alice, bob = register("alice"), register("bob")
    assert send(alice, "bob", "hi").status_code == 201
    api.patch("sessions/me", bob.token, {"status": "busy"})
    subscribed = api.post("teams/subscriptions", alice.token, {"target": bob.id})
    assert subscribed.status_code == 201, subscribed.json_body
    page = operator_client.get(f"/sessions/{alice.id}/")
    assert [p.recipient.name for p in page.context["pins"]] == ["bob"]
    assert [(s["subscriber"].name, s["target"].name, s["state"]) for s in page.context["subscriptions"]] == [
        ("alice", "bob", "waiting")
    ]
    assert b"waits for bob" in page.content


def test_a_session_not_seen_for_long_is_dead_by_the_one_rule(register, settings):
    alice = register("alice")
    session = AgentSession.objects.get(pk=alice.id)
    now = timezone.now()
    assert session_liveness(session, now=now) == "idle"
    later = now + timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 1)
    assert session_liveness(session, now=later) == "dead"
    assert AgentSession.objects.filter(dead_sessions_q(later)).get() == session
    session.status = "stopped"
    assert session_liveness(session, now=later) == "stopped"


def test_the_pages_show_the_servers_verdict_on_dead_sessions(register, operator_client, settings):
    """Given alice went silent past the timeout and bob did not, the dashboard, its dead-only list,
    the attention strip and the catch-up feed all say alice is dead and bob is not."""
    alice = register("alice")
    register("bob")
    silent = timezone.now() - timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 5)
    AgentSession.objects.filter(pk=alice.id).update(last_seen=silent)
    rows = {s["name"]: s["display_status"] for s in operator_client.get("/").context["sessions"]}
    assert rows == {"alice": "dead", "bob": "idle"}
    dead_only = operator_client.get("/?liveness=dead")
    assert [s["name"] for s in dead_only.context["sessions"]] == ["alice"]
    assert dead_only.context["attention"]["dead"] == 1
    assert b'href="/?liveness=dead" data-attention="dead" data-count="1"' in dead_only.content
    rows = operator_client.get("/console/updates?after=0&sessions=all").json()["sessions"]
    assert {r["name"]: r["liveness"] for r in rows} == {"alice": "dead", "bob": "idle"}
    assert b"data-dead-after" not in dead_only.content  # the browser no longer decides it


def test_catch_up_after_too_many_changes_asks_the_browser_to_reload(db, monkeypatch):
    monkeypatch.setattr(selectors, "CATCH_UP_LIMIT", 3)
    monkeypatch.setattr(selectors, "CATCH_UP_OVERLAP", 0)
    AuditEvent.objects.bulk_create([AuditEvent(kind="x.y", actor="hub") for _ in range(5)])
    cursor = selectors.audit_cursor()
    assert selectors.updates_since(after=0)["reload"] is True
    assert selectors.updates_since(after=cursor) == {
        "cursor": cursor,
        "reload": False,
        "deliveries": [],
        "sessions": [],
        "teams": False,
    }


def test_catch_up_rereads_a_little_before_the_cursor(register, send):
    """An audit id is taken before commit, so a slow transaction can land just below a cursor the
    browser already holds; catch-up re-reads the last few ids so that change is not lost."""
    alice, _ = register("alice"), register("bob")
    sent = send(alice, "bob", "hello").json_body
    cursor = selectors.audit_cursor()
    update = selectors.updates_since(after=cursor)
    assert update["cursor"] == cursor
    assert [d["message_id"] for d in update["deliveries"]] == [sent["id"]]


def test_the_audit_page_filters_by_kind_and_actor(held_for_audit, operator_client):
    page = operator_client.get("/audit/?kind=delivery.&actor=session:")
    kinds = {e.kind for e in page.context["events"]}
    assert kinds and all(k.startswith("delivery.") for k in kinds)
    assert all(e.actor.startswith("session:") for e in page.context["events"])


@pytest.fixture
def held_for_audit(register, send):
    alice, _ = register("alice"), register("bob")
    assert send(alice, "bob", "hello").status_code == 201


def test_the_admin_opens_for_an_operator_with_admin_rights_and_is_read_only(register, send, db):
    alice, _ = register("alice"), register("bob")
    send(alice, "bob", "hello")
    admin = get_user_model().objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.force_login(admin)
    for model in [
        "agentsession",
        "message",
        "delivery",
        "auditevent",
        "pin",
        "senderpolicy",
        "operatortoken",
    ]:
        assert client.get(f"/admin/messaging/{model}/").status_code == 200, model
    assert client.get("/admin/messaging/delivery/add/").status_code == 403
    session_page = client.get(f"/admin/messaging/agentsession/{alice.id}/change/")
    assert session_page.status_code == 200
    assert b"token_hash" not in session_page.content


def test_operator_create_makes_a_staff_login_from_stdin(db, monkeypatch):
    monkeypatch.setattr("sys.stdin", StringIO("a-long-enough-password\n"))
    out = StringIO()
    call_command("operator_create", "grace", "--password-stdin", stdout=out)
    user = get_user_model().objects.get(username="grace")
    assert user.is_staff and user.is_superuser and user.check_password("a-long-enough-password")
    assert AuditEvent.objects.filter(kind="operator.created", target="operator:grace").exists()
    client = Client()
    assert (
        client.post("/login/", {"username": "grace", "password": "a-long-enough-password"}).status_code == 302
    )


def test_operator_create_refuses_a_short_password(db, monkeypatch):
    monkeypatch.setattr("sys.stdin", StringIO("short\n"))
    with pytest.raises(CommandError, match="too short"):
        call_command("operator_create", "grace", "--password-stdin")
    assert not get_user_model().objects.filter(username="grace").exists()


def test_revoking_an_operator_token_in_the_admin_is_audited_and_takes_effect(api, operator_token):
    from messaging.models import OperatorToken

    admin = get_user_model().objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.force_login(admin)
    row = OperatorToken.objects.get(name="test-operator")
    assert api.get("audit", operator_token).status_code == 200
    response = client.post(
        "/admin/messaging/operatortoken/", {"action": "tokens_revoke", "_selected_action": [row.pk]}
    )
    assert response.status_code == 302
    assert AuditEvent.objects.filter(kind="operator_token.revoked", actor="operator:root").exists()
    assert api.get("audit", operator_token).status_code == 401
