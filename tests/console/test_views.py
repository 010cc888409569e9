"""Console pages: login on every page, CSRF on every POST, operators only, message text escaped."""

from __future__ import annotations

import pytest
from django.test import Client

from messaging.models import AgentSession, Delivery
from tests.console.conftest import csrf_post

PAGES = ["/", "/holds/", "/audit/", "/console/updates"]
SCRIPT = "<script>alert('pwned')</script>"


@pytest.fixture
def held(api, register, send, operator_client):
    """alice sends bob a message that bob's operator-set `hold` policy holds. Returns (alice, bob, id)."""
    alice, bob = register("alice"), register("bob")
    response = csrf_post(operator_client, f"/sessions/{bob.id}/policy", {"policy": "hold"})
    assert response.status_code == 302
    assert AgentSession.objects.get(pk=bob.id).operator_policy == "hold"
    sent = send(alice, "bob", f"deploy? {SCRIPT}", summary=f"ask {SCRIPT}")
    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["status"] == "held"
    return alice, bob, sent.json_body["id"]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_sends_an_anonymous_browser_to_the_login(db, url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.parametrize("url", PAGES)
def test_a_user_who_is_not_an_operator_sees_no_page(visitor_client, url):
    response = visitor_client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_login_form_refuses_a_valid_password_of_a_non_operator(db):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("visitor", password="visitor-pw-123", is_staff=False)
    client = Client()
    response = client.post("/login/", {"username": "visitor", "password": "visitor-pw-123"})
    assert response.status_code == 200
    assert b"not an operator" in response.content
    assert client.get("/").status_code == 302


def test_an_operator_logs_in_and_sees_the_dashboard(db, register):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("op", password="op-password-123", is_staff=True)
    register("alice", cwd="/work/a")
    client = Client()
    response = client.post("/login/", {"username": "op", "password": "op-password-123"})
    assert response.status_code == 302
    page = client.get("/")
    assert page.status_code == 200
    assert b"alice" in page.content
    assert "script-src 'self'" in page["Content-Security-Policy"]


def test_message_text_is_escaped_on_every_page_that_shows_it(held, operator_client):
    _, bob, message_id = held
    for url in ["/", "/holds/", f"/messages/{message_id}/", f"/sessions/{bob.id}/"]:
        page = operator_client.get(url)
        assert page.status_code == 200, url
        assert SCRIPT.encode() not in page.content, url
        assert b"&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page.content, url


def test_the_holds_queue_lists_a_policy_hold_with_its_facts(held, operator_client):
    alice, bob, message_id = held
    page = operator_client.get("/holds/").content.decode()
    assert message_id in page
    assert f"alice [{alice.ref}]" in page and f"bob [{bob.ref}]" in page
    assert "host-verified" in page


def test_a_decision_without_the_csrf_token_is_refused(held, operator_client):
    delivery = Delivery.objects.get(state="held")
    response = operator_client.post("/holds/decide", {"delivery_ids": [delivery.pk], "action": "approve"})
    assert response.status_code == 403
    assert Delivery.objects.get(pk=delivery.pk).state == "held"


def test_a_non_operator_cannot_decide_even_with_a_token(held, visitor_client):
    delivery = Delivery.objects.get(state="held")
    response = csrf_post(
        visitor_client, "/holds/decide", {"delivery_ids": [delivery.pk], "action": "approve"}
    )
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Delivery.objects.get(pk=delivery.pk).state == "held"


def test_approving_queues_the_message_and_the_recipient_receives_it(held, operator_client, api):
    _, bob, message_id = held
    delivery = Delivery.objects.get(state="held")
    response = csrf_post(
        operator_client,
        "/holds/decide",
        {"delivery_ids": [delivery.pk], "action": "approve", "reason": "fine"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["moved"] == [delivery.pk]
    assert [m["id"] for m in api.get("inbox", bob.token).json_body["messages"]] == [message_id]
    assert Delivery.objects.get(pk=delivery.pk).decided_by == "operator:op"
    audit = operator_client.get("/audit/?actor=operator:").content.decode()
    assert "delivery.queued" in audit and "operator:op" in audit


def test_denying_many_at_once_means_none_arrive(held, operator_client, api, send):
    alice, bob, _ = held
    second = send(alice, "bob", "and another")
    assert second.json_body["status"] == "held"
    ids = list(Delivery.objects.filter(state="held").values_list("pk", flat=True))
    assert len(ids) == 2
    response = csrf_post(
        operator_client,
        "/holds/decide",
        {"delivery_ids": ids, "action": "deny", "reason": "no deploys today"},
    )
    assert response.status_code == 302
    assert set(Delivery.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"denied"}
    held_ids = {str(m) for m in Delivery.objects.filter(pk__in=ids).values_list("message_id", flat=True)}
    pulled = api.get("inbox", bob.token, include_unacked=True).json_body["messages"]
    assert held_ids.isdisjoint(m["id"] for m in pulled)
    # Deciding again changes nothing and says so.
    again = csrf_post(
        operator_client,
        "/holds/decide",
        {"delivery_ids": ids, "action": "approve"},
        HTTP_ACCEPT="application/json",
    )
    assert again.json() | {"verb": ""} == {
        "action": "approve",
        "moved": [],
        "skipped": sorted(ids),
        "verb": "",
    }


def test_a_decision_with_no_hold_selected_is_a_clear_error(operator_client, db):
    response = csrf_post(operator_client, "/holds/decide", {"action": "deny"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert "Select at least one" in response.json()["detail"]


def test_catch_up_returns_what_changed_after_the_cursor(held, operator_client):
    _, bob, message_id = held
    delivery = Delivery.objects.get(state="held")
    before = operator_client.get("/console/updates?after=0").json()
    cursor = before["cursor"]
    assert before["held_count"] == 1
    csrf_post(operator_client, "/holds/decide", {"delivery_ids": [delivery.pk], "action": "deny"})
    update = operator_client.get(f"/console/updates?after={cursor}").json()
    assert update["cursor"] > cursor
    changed = {d["delivery_id"]: d for d in update["deliveries"]}
    assert changed[delivery.pk]["state"] == "denied"
    # The hub's notice to the sender is a new delivery too, so the feed shows it.
    assert [d["to"]["name"] for k, d in changed.items() if k != delivery.pk] == ["alice"]
    assert update["held_count"] == 0


def test_policy_and_sender_rules_are_set_by_the_operator(operator_client, register):
    alice, bob = register("alice"), register("bob")
    response = csrf_post(
        operator_client, f"/sessions/{bob.id}/policy", {"policy": "refuse", "hold_expiry_seconds": "120"}
    )
    assert response.status_code == 302
    bob_row = AgentSession.objects.get(pk=bob.id)
    assert (bob_row.operator_policy, bob_row.hold_expiry_seconds) == ("refuse", 120)
    response = csrf_post(
        operator_client, f"/sessions/{bob.id}/sender-policy", {"sender": alice.id, "action": "accept"}
    )
    assert response.status_code == 302
    page = operator_client.get(f"/sessions/{bob.id}/").content.decode()
    assert "data-operator-floor><strong>refuse</strong> (set by an operator)" in page
    assert "data-hold-expiry>120 s (set for this session" in page
    assert f"alice [{alice.ref}]" in page and "(operator)" in page


def test_an_operator_ends_a_session_from_its_page_and_its_token_stops_working(
    operator_client, visitor_client, register, api
):
    """Given bob's page, ending him without ticking the box changes nothing; with it, bob exits,
    his token answers 401 and the page no longer offers to end him. A visitor cannot end anyone."""
    bob = register("bob")
    page = operator_client.get(f"/sessions/{bob.id}/").content.decode()
    assert f'action="/sessions/{bob.id}/end"' in page

    assert csrf_post(operator_client, f"/sessions/{bob.id}/end", {}).status_code == 302
    assert AgentSession.objects.get(pk=bob.id).status != "exited"
    csrf_post(visitor_client, f"/sessions/{bob.id}/end", {"confirm": "on"})
    assert AgentSession.objects.get(pk=bob.id).status != "exited"

    assert csrf_post(operator_client, f"/sessions/{bob.id}/end", {"confirm": "on"}).status_code == 302
    assert AgentSession.objects.get(pk=bob.id).status == "exited"
    assert api.get("sessions/me", bob.token).status_code == 401
    page = operator_client.get(f"/sessions/{bob.id}/").content.decode()
    assert "has ended: its token no longer works" in page
    assert f'action="/sessions/{bob.id}/end"' not in page


def test_saving_a_floor_leaves_the_hold_expiry_to_the_hub_default(operator_client, register):
    import re

    bob = register("bob")
    page = operator_client.get(f"/sessions/{bob.id}/").content.decode()
    field = re.search(r'<input[^>]*name="hold_expiry_seconds"[^>]*>', page).group(0)
    value = re.search(r'value="([^"]*)"', field)
    # The operator picks a floor and saves the form as the page filled it.
    form = {"policy": "hold", "hold_expiry_seconds": value.group(1) if value else ""}
    assert csrf_post(operator_client, f"/sessions/{bob.id}/policy", form).status_code == 302
    bob_row = AgentSession.objects.get(pk=bob.id)
    assert (bob_row.operator_policy, bob_row.hold_expiry_seconds) == ("hold", None)
    assert "s (the hub's default)</dd>" in operator_client.get(f"/sessions/{bob.id}/").content.decode()


def test_a_bad_policy_value_is_refused_with_a_message(operator_client, register):
    bob = register("bob")
    response = csrf_post(operator_client, f"/sessions/{bob.id}/policy", {"policy": "maybe"})
    assert response.status_code == 302
    assert AgentSession.objects.get(pk=bob.id).operator_policy is None
    follow = operator_client.get(f"/sessions/{bob.id}/")
    assert b"not one of the available choices" in follow.content


def test_unknown_ids_are_404(operator_client):
    for url in [
        "/sessions/00000000-0000-0000-0000-000000000000/",
        "/messages/00000000-0000-0000-0000-000000000000/",
        "/teams/00000000-0000-0000-0000-000000000000/",
    ]:
        assert operator_client.get(url).status_code == 404, url


def test_catch_up_can_refresh_every_sessions_last_seen(operator_client, register, api):
    """Heartbeats are not audited, so the dashboard asks for every session now and then."""
    alice = register("alice")
    cursor = operator_client.get("/console/updates?after=0").json()["cursor"]
    assert operator_client.get(f"/console/updates?after={cursor + 100}").json()["sessions"] == []
    api.post("sessions/me/heartbeat", alice.token)
    seen = AgentSession.objects.get(pk=alice.id).last_seen.isoformat()
    rows = operator_client.get(f"/console/updates?after={cursor + 100}&sessions=all").json()["sessions"]
    assert [(r["id"], r["last_seen"], r["display_status"]) for r in rows] == [(alice.id, seen, "idle")]


def test_the_holds_queue_can_show_one_recipients_holds(held, operator_client, register, send, api):
    alice, bob, message_id = held
    carol = register("carol")
    csrf_post(operator_client, f"/sessions/{carol.id}/policy", {"policy": "hold"})
    other = send(alice, "carol", "for carol").json_body
    everything = operator_client.get("/holds/").content.decode()
    assert message_id in everything and other["id"] in everything
    only_bob = operator_client.get(f"/holds/?recipient={bob.id}").content.decode()
    assert message_id in only_bob and other["id"] not in only_bob
    assert f'data-recipient-filter="{bob.id}"' in only_bob
    assert operator_client.get("/holds/?recipient=nonsense").status_code == 200
