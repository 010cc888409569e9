"""What the console puts first and how it reads: the attention strip, holds grouped by pair and
reason, conversations threaded by reply, the filtered feed, and the words on the message, session
and team pages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from hub_fixtures.sensitivity_corpus import AWS_SECRET
from messaging.hold_reasons import HOLD_REASONS, hold_reason_label, hold_reason_text
from messaging.models import AgentSession, Delivery
from tests.console.conftest import csrf_post
from tests.teams.conftest import join_team

SECRET_TEXT = f"creds: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} (rotate after)"


@pytest.fixture
def holding(operator_client, register):
    """bob's operator floor is hold. Returns (alice, bob, carol)."""
    alice, bob, carol = register("alice"), register("bob"), register("carol")
    assert csrf_post(operator_client, f"/sessions/{bob.id}/policy", {"policy": "hold"}).status_code == 302
    return alice, bob, carol


def _sent(response) -> str:
    assert response.status_code == 201, response.json_body
    return response.json_body["id"]


# ------------------------------------------------------------------ vocabulary


def test_each_hold_reason_has_both_wordings_and_an_unknown_code_shows_as_it_is():
    for code, reason in HOLD_REASONS.items():
        assert reason.operator and reason.sender, code
        assert hold_reason_label(code) == reason.operator
        assert hold_reason_text(code) == reason.sender
    assert hold_reason_label("own_policy") == "the recipient's own policy: hold"
    assert hold_reason_label("sensitive", ["AWS secret access key"]) == "sensitive: AWS secret access key"
    assert hold_reason_label("brand_new") == "brand_new" and hold_reason_text("brand_new") == "brand_new"


# ------------------------------------------------------------------ attention strip


def test_the_attention_strip_is_on_every_page_with_a_link_for_each_figure(
    holding, operator_client, send, settings
):
    alice, bob, carol = holding
    _sent(send(alice, "bob", "one"))
    _sent(send(alice, "bob", SECRET_TEXT))
    silent = timezone.now() - timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 5)
    AgentSession.objects.filter(pk=carol.id).update(last_seen=silent)
    first_expiry = Delivery.objects.filter(state="held").order_by("expires_at").first().expires_at

    for url in ["/", "/holds/", "/audit/", "/peers/", f"/sessions/{bob.id}/"]:
        page = operator_client.get(url)
        assert page.status_code == 200, url
        assert page.context["attention"] == {
            "held": 2,
            "escalated": 1,
            "next_expiry": first_expiry.isoformat(),
            "next_expiry_message": page.context["attention"]["next_expiry_message"],
            "dead": 1,
        }, url
        html = page.content.decode()
        assert 'href="/holds/" data-attention="held" data-count="2"' in html, url
        assert 'href="/holds/?escalated=1" data-attention="escalated" data-count="1"' in html, url
        assert 'href="/holds/?sort=expires" data-attention="next-expiry"' in html, url
        assert 'href="/?liveness=dead" data-attention="dead" data-count="1"' in html, url
    assert operator_client.get("/console/attention").json()["held"] == 2
    assert operator_client.get("/console/updates?after=0").json()["attention"]["escalated"] == 1


def test_the_attention_figures_need_an_operator(visitor_client):
    assert visitor_client.get("/console/attention").status_code == 302


# ------------------------------------------------------------------ holds in context


def test_holds_are_grouped_by_pair_and_reason_with_one_form_for_the_group(holding, operator_client, send):
    alice, bob, carol = holding
    loop = [_sent(send(alice, "bob", f"loop {i}")) for i in range(3)]
    lone = _sent(send(carol, "bob", "from carol"))
    page = operator_client.get("/holds/")
    groups = page.context["groups"]
    assert sorted((g["sender"]["name"], g["count"], g["hold_reason"]) for g in groups) == [
        ("alice", 3, "operator_policy"),
        ("carol", 1, "operator_policy"),
    ]
    alices = next(g for g in groups if g["sender"]["name"] == "alice")
    assert [h["message_id"] for h in alices["holds"]] == loop
    assert alices["why"] == "operator's floor for the recipient: hold"
    html = page.content.decode()
    # A group of several starts collapsed, with one decision for all of it; a lone hold has none.
    group = re.search(
        rf'<tbody class="hold-group" data-group="{alice.id}[^"]*" data-collapsed>(.*?)</tbody>', html, re.S
    )
    assert group is not None
    ids = re.findall(
        r'<input type="hidden" name="delivery_ids" value="(\d+)">', group.group(1).split("</form>")[0]
    )
    assert sorted(ids) == sorted(str(Delivery.objects.get(message_id=m).pk) for m in loop)
    assert "Approve all <span data-group-count>3</span>" in group.group(1)
    assert html.count("data-group-form") == 1
    assert lone in html and "data-age=" in html


def test_one_post_decides_a_group_and_an_escalated_group_needs_a_reason(holding, operator_client, send):
    alice, bob, _ = holding
    loop = [_sent(send(alice, "bob", f"loop {i}")) for i in range(3)]
    ids = [Delivery.objects.get(message_id=m).pk for m in loop]
    decided = csrf_post(
        operator_client,
        "/holds/decide",
        {"delivery_ids": ids, "action": "deny", "reason": "a loop"},
        HTTP_ACCEPT="application/json",
    )
    assert decided.status_code == 200 and sorted(decided.json()["moved"]) == sorted(ids)
    assert set(Delivery.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"denied"}

    secrets = [_sent(send(alice, "bob", SECRET_TEXT + f" #{i}")) for i in range(2)]
    ids = [Delivery.objects.get(message_id=m).pk for m in secrets]
    refused = csrf_post(
        operator_client,
        "/holds/decide",
        {"delivery_ids": ids, "action": "approve", "reason": ""},
        HTTP_ACCEPT="application/json",
    )
    assert refused.status_code == 400 and refused.json()["reason"] == "reason_required"
    assert set(Delivery.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"held"}


def test_holds_sort_by_age_or_expiry_and_filter_to_the_escalated(holding, operator_client, send):
    alice, bob, carol = holding
    older = _sent(send(carol, "bob", "older"))
    newer = _sent(send(alice, "bob", "newer"))
    secret = _sent(send(alice, "bob", SECRET_TEXT))
    now = timezone.now()
    Delivery.objects.filter(message_id=older).update(
        held_at=now - timedelta(minutes=9), expires_at=now + timedelta(minutes=9)
    )
    Delivery.objects.filter(message_id=newer).update(
        held_at=now - timedelta(minutes=1), expires_at=now + timedelta(minutes=1)
    )

    def order(query: str) -> list[str]:
        return [
            h["message_id"]
            for g in operator_client.get("/holds/" + query).context["groups"]
            for h in g["holds"]
        ]

    assert order("")[0] == secret  # escalated first by default
    assert order("?sort=held")[0] == older  # longest waiting first
    assert order("?sort=expires")[0] == newer  # soonest to expire first
    assert order("?escalated=1") == [secret]
    assert order("?sort=nonsense")[0] == secret


# ------------------------------------------------------------------ conversations


@pytest.fixture
def thread(holding, api, send, operator_client):
    """alice asks bob (held, approved with a reason); bob answers; alice answers that; carol
    writes to alice; alice sends bob a secret (held, escalated). Returns the ids in order."""
    alice, bob, carol = holding
    ask = _sent(send(alice, "bob", "shall I merge?", summary="merge?"))
    csrf_post(
        operator_client,
        "/holds/decide",
        {
            "delivery_ids": [Delivery.objects.get(message_id=ask).pk],
            "action": "approve",
            "reason": "fine by me",
        },
    )
    assert csrf_post(operator_client, f"/sessions/{bob.id}/policy", {"policy": ""}).status_code == 302
    answer = _sent(send(bob, "alice", "yes, merge it", in_reply_to=ask))
    thanks = _sent(send(alice, "bob", "merged, thanks", in_reply_to=answer))
    aside = _sent(send(carol, "alice", "lunch?"))
    secret = _sent(send(alice, "bob", SECRET_TEXT, summary="the key"))
    return {"ask": ask, "answer": answer, "thanks": thanks, "aside": aside, "secret": secret}


def test_a_pairs_conversation_is_threaded_with_states_and_decisions_and_masks_secrets(
    thread, holding, operator_client
):
    alice, bob, _ = holding
    page = operator_client.get(f"/conversations/{alice.id}/{bob.id}/")
    assert page.status_code == 200
    entries = [(e["m"]["id"], e["depth"]) for e in page.context["entries"]]
    assert entries == [
        (thread["ask"], 0),
        (thread["answer"], 1),
        (thread["thanks"], 2),
        (thread["secret"], 0),
    ]
    html = page.content.decode()
    assert thread["aside"] not in html  # carol is not in this pair
    assert "Approved by operator:op: “fine by me”" in html
    assert "Held for bob because sensitive." in html
    assert AWS_SECRET not in html and f"[AWS secret access key {AWS_SECRET[:4]}" in html
    assert f'href="/sessions/{alice.id}/export?with={bob.id}&amp;format=md"' in html
    # The same page from the other side, and a pair of one session is no conversation.
    assert operator_client.get(f"/conversations/{bob.id}/{alice.id}/").status_code == 200
    assert operator_client.get(f"/conversations/{bob.id}/{bob.id}/").status_code == 404


def test_a_teams_conversation_holds_its_rosters_messages(api, register, send, operator_client):
    lead, mate = register("lead1"), register("mate")
    register("outsider")
    team = api.post("teams", lead.token, {"name": "checkout"}).json_body
    join_team(api, lead, team["id"], mate)
    inside = _sent(send(lead, "mate", "start on the schema"))
    outside = _sent(send(lead, "outsider", "not team business"))
    page = operator_client.get(f"/teams/{team['id']}/conversation/")
    ids = [e["m"]["id"] for e in page.context["entries"]]
    assert inside in ids and outside not in ids
    assert f'href="/teams/{team["id"]}/export?&amp;format=md"' in page.content.decode()
    assert operator_client.get("/teams/00000000-0000-0000-0000-000000000000/conversation/").status_code == 404


def test_conversations_are_reachable_from_sessions_teams_holds_and_messages(
    thread, holding, api, operator_client
):
    alice, bob, _ = holding
    pair = f'href="/conversations/{alice.id}/{bob.id}/"'
    assert (
        f'href="/conversations/{alice.id}/' in operator_client.get(f"/sessions/{alice.id}/").content.decode()
    )
    assert pair in operator_client.get(f"/messages/{thread['ask']}/").content.decode()
    assert pair in operator_client.get("/holds/").content.decode()  # the secret is still held
    team = api.post("teams", alice.token, {"name": "pair-team"}).json_body
    assert (
        f'href="/teams/{team["id"]}/conversation/"'
        in operator_client.get(f"/teams/{team['id']}/").content.decode()
    )


# ------------------------------------------------------------------ the feed


def test_the_feed_filters_by_state_tier_session_and_team_and_dates_its_times(
    thread, holding, api, register, send, operator_client
):
    alice, bob, carol = holding

    def shown(query: str) -> set[str]:
        return {d["message_id"] for d in operator_client.get("/" + query).context["feed"]}

    assert shown("?state=held") == {thread["secret"]}
    assert shown("?tier=sensitive") == {thread["secret"]}
    assert shown(f"?session={carol.id}") == {thread["aside"]}
    team = api.post("teams", carol.token, {"name": "lunch"}).json_body
    assert shown(f"?team={team['id']}") == {thread["aside"]}
    assert set(thread.values()) <= shown("?state=nonsense&tier=&session=bad")
    html = operator_client.get(f"/?session={carol.id}").content.decode()
    today = timezone.now().date().isoformat()
    assert re.search(rf'<time data-slot="time" datetime="[^"]+">{today} \d\d:\d\d:\d\d</time>', html)
    assert f'data-feed-sessions="{carol.id}"' in html


# ------------------------------------------------------------------ small things


def test_the_message_page_is_headed_by_its_summary_and_words_its_hold(holding, operator_client, send):
    alice, bob, _ = holding
    message_id = _sent(send(alice, "bob", "please deploy", summary="deploy request"))
    html = operator_client.get(f"/messages/{message_id}/").content.decode()
    assert '<h1 class="message-heading">deploy request</h1>' in html
    assert "<title>deploy request · Switchboard</title>" in html
    assert "data-held-because>operator&#x27;s floor for the recipient: hold</dd>" in html
    AgentSession.objects.filter(pk=bob.id).update(operator_policy=None, inbound_policy="hold")
    own = _sent(send(alice, "bob", "again", summary="again"))
    assert (
        "the recipient&#x27;s own policy: hold" in operator_client.get(f"/messages/{own}/").content.decode()
    )


def test_the_session_page_separates_the_floor_from_the_sessions_own_policy(
    register, api, operator_client, settings
):
    bob = register("bob")
    assert api.call("PUT", f"sessions/{bob.ref}/policy", bob.token, {"policy": "hold"}).status_code == 200
    html = operator_client.get(f"/sessions/{bob.id}/").content.decode()
    assert "data-operator-floor>none set: the default by permission mode" in html
    assert "data-own-policy><strong>hold</strong> (set by the session)" in html
    default = settings.SWITCHBOARD_HOLD_EXPIRY_SECONDS
    assert f"data-hold-expiry>{default} s (the hub's default)" in html
    field = re.search(r'<input type="number" name="hold_expiry_seconds"[^>]*>', html).group(0)
    assert "value=" not in field and f'placeholder="the hub&#x27;s default, {default}"' in field
    assert "Operator&#x27;s floor</label>" in html


def test_blocked_tasks_are_marked_and_cards_open(api, register, operator_client):
    lead, mate = register("lead1"), register("ui")
    team = api.post("teams", lead.token, {"name": "board"}).json_body
    join_team(api, lead, team["id"], mate)
    first = api.post(
        f"teams/{team['id']}/tasks", lead.token, {"title": "Schema", "description": "tables <and> keys"}
    ).json_body
    api.post(f"teams/{team['id']}/tasks", lead.token, {"title": "Endpoints", "blocked_by": [first["id"]]})
    html = operator_client.get(f"/teams/{team['id']}/").content.decode()
    card = re.search(r'<li class="card blocked" data-task="\d+">(.*?)</li>', html, re.S)
    assert card is not None and "Endpoints" in card.group(1)
    assert '<span class="blocked-badge">Blocked</span>' in card.group(1)
    assert f"waiting on #{first['id']} Schema (pending)" in card.group(1)
    assert html.count('<details class="card-details"') == 2
    assert "tables &lt;and&gt; keys" in html
