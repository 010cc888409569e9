"""What one session's token reaches through the team surface (round 2): each test performs the
attack with a session that holds its own token only, through the hub's real API."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from messaging.models import AuditEvent, Delivery
from teams.models import Invitation, Team
from teams.services import invitations

pytestmark = pytest.mark.django_db


def _without_lead(body: dict[str, Any], lead: Any) -> dict[str, Any]:
    """An answer with the asked session's own id and label, and the request's own id and times,
    taken out, to compare answers about two leads."""
    request = body.get("request") or {}
    masks = {request.get("id"): "Q", lead.id: "L", lead.name: "X", lead.ref: "R"}
    masks |= {request.get(t): "T" for t in ("created_at", "expires_at", "answered_at")}

    def masked(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: masked(v) for k, v in value.items()}
        if isinstance(value, str):
            for seen, mask in masks.items():
                value = value.replace(seen, mask) if seen else value
        return value

    return masked(body)


def test_asking_to_join_does_not_tell_who_leads_which_team(api, register):
    """The attack: eve, invited by nobody, asks to join each session in turn. Were the answer for a
    session that leads a team other than for one that leads none, or did it carry the team's id or
    name, eve would map who leads what. Both answers must be the same, with nothing of the team,
    and her open request must not show in her own list of invitations either."""
    eve, boss, loner = register("eve"), register("boss"), register("loner")
    team = api.post("teams", boss.token, {"name": "secret-project"}).json_body

    to_lead = api.post("teams/join", eve.token, {"lead": boss.id})
    to_loner = api.post("teams/join", eve.token, {"lead": loner.id})

    assert (to_lead.status_code, to_loner.status_code) == (202, 202)
    assert _without_lead(to_lead.json_body, boss) == _without_lead(to_loner.json_body, loner)
    for answer in (to_lead, to_loner):
        assert team["id"] not in str(answer.json_body) and "secret-project" not in str(answer.json_body)
    listed = api.get("teams/invitations", eve.token).json_body["invitations"]
    assert listed == []
    # The lead was asked (and only the lead's team holds a request): the legitimate path still works.
    assert Invitation.objects.filter(session_id=eve.id).count() == 1
    added = api.post(f"teams/{team['id']}/members", boss.token, {"session": eve.id})
    assert added.status_code == 201, added.json_body


def test_an_invited_session_joins_by_asking_its_lead(api, register):
    """The legitimate path the rule above keeps: a session the lead invited joins at once when it
    asks, and is then entitled to its team."""
    boss, mate = register("boss"), register("mate")
    team = api.post("teams", boss.token, {"name": "open-project"}).json_body
    assert api.post(f"teams/{team['id']}/members", boss.token, {"session": mate.id}).status_code == 202
    joined = api.post("teams/join", mate.token, {"lead": "boss"})
    assert joined.status_code == 201 and joined.json_body["member_id"], joined.json_body
    assert api.get("teams/mine", mate.token).json_body["team"]["name"] == "open-project"


def _idle(api: Any, agent: Any, answer: str) -> None:
    assert api.patch("sessions/me", agent.token, {"status": "busy"}).status_code == 200
    assert (
        api.patch("sessions/me", agent.token, {"status": "idle", "final_answer": answer}).status_code == 200
    )


def test_a_notice_about_a_session_does_not_use_its_share_of_the_subscribers_inbox(api, register, settings):
    """The attack: eve subscribes to alice's next idle (notify-when-idle), so the hub writes a
    notice in alice's name into eve's inbox, which eve leaves unread. Were that notice counted in
    alice's share of eve's unread cap, alice's own messages to eve would be refused early, and
    the refusal (`unread_share_full`, "has not read N of your messages") would tell alice that eve
    watches her: a message alice never sent."""
    settings.SWITCHBOARD_UNREAD_PER_SENDER = 1
    eve, alice = register("eve"), register("alice")
    assert api.post("teams/subscriptions", eve.token, {"target": alice.id}).status_code == 201
    _idle(api, alice, "done")
    assert Delivery.objects.filter(recipient_id=eve.id, message__sender_id=alice.id).count() == 1

    sent = api.post("messages", alice.token, {"to": eve.id, "message": "hi eve"})

    assert sent.status_code == 201, sent.json_body
    refused = api.post("messages", alice.token, {"to": eve.id, "message": "and again"})
    assert refused.status_code == 429 and "not read 1 of your" in refused.json_body["detail"]


def test_a_notice_about_a_session_is_not_counted_among_its_holds_for_a_stopped_subscriber(
    api, register, settings
):
    """The same attack on the room for messages held for a stopped session: eve's notice about
    alice waits for eve, who is stopped. Were it counted among alice's messages held there, alice's
    first message to eve would be refused with "already has 1 of yours held": word of a notice
    alice never sent."""
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER = 1
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB = 1
    eve, alice = register("eve"), register("alice")
    assert api.patch("sessions/me", alice.token, {"status": "busy"}).status_code == 200
    assert api.post("teams/subscriptions", eve.token, {"target": alice.id}).status_code == 201
    assert api.patch("sessions/me", eve.token, {"status": "stopped"}).status_code == 200
    _idle(api, alice, "done")
    assert (
        Delivery.objects.filter(recipient_id=eve.id, message__sender_id=alice.id, state="held").count() == 1
    )

    sent = api.post("messages", alice.token, {"to": eve.id, "message": "hi eve"})

    assert sent.status_code == 201 and sent.json_body["status"] == "held", sent.json_body


def churn_teams(api: Any, token: str, *, rounds: int) -> list[int]:
    """Create a team and end it, `rounds` times, stopping at the first refusal: the statuses."""
    answers = []
    for round_ in range(rounds):
        made = api.post("teams", token, {"name": f"churn-{round_}"})
        answers.append(made.status_code)
        if made.status_code != 201:
            break
        answers.append(api.post(f"teams/{made.json_body['id']}/end", token).status_code)
    return answers


def test_creating_and_ending_teams_at_request_speed_is_bounded(api, register, settings):
    """The attack: eve creates a team and ends it, again and again, as fast as the hub answers;
    each round writes a team, a roster row and audit events, with no bound but her speed. Past
    SWITCHBOARD_TEAM_CHANGE_RATE changes a window she gets 429 `rate_limited` (reason
    `team_rate`) and nothing is written."""
    settings.SWITCHBOARD_TEAM_CHANGE_RATE = 4
    settings.SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS = 3600
    eve = register("eve")
    assert churn_teams(api, eve.token, rounds=5) == [201, 200, 201, 200, 429]
    written = (Team.objects.count(), AuditEvent.objects.count())
    refused = api.post("teams", eve.token, {"name": "one more"})
    assert refused.status_code == 429 and refused.json_body["reason"] == "team_rate", refused.json_body
    assert refused.json_body["retry_after"] > 0
    assert (Team.objects.count(), AuditEvent.objects.count()) == written


def test_opening_and_withdrawing_invitations_at_request_speed_is_bounded(api, register, settings):
    """The same churn with invitations: eve, a lead, invites a session and withdraws the
    invitation in a loop (and asks leads to let her join): each writes an invitation or its
    close, audit events and a notice. The same per-session bound holds for every such change."""
    settings.SWITCHBOARD_TEAM_CHANGE_RATE = 5
    settings.SWITCHBOARD_TEAM_CHANGE_RATE_SECONDS = 3600
    eve, victim = register("eve"), register("victim")
    team = api.post("teams", eve.token, {"name": "churn"}).json_body  # 1 change
    answers = []
    for _ in range(3):
        invited = api.post(f"teams/{team['id']}/members", eve.token, {"session": victim.id})
        answers.append(invited.status_code)
        if invited.status_code != 202:
            break
        withdrawn = api.delete(f"teams/invitations/{invited.json_body['invitation']['id']}", eve.token)
        answers.append(withdrawn.status_code)
    assert answers == [202, 200, 202, 200, 429]
    assert Invitation.objects.filter(team_id=team["id"]).count() == 2
    asker = register("asker")
    settings.SWITCHBOARD_TEAM_CHANGE_RATE = 1
    assert api.post("teams/join", asker.token, {"lead": eve.id}).status_code == 202
    # Asking costs the same whoever is asked, so the bound tells nothing of who leads a team.
    again = api.post("teams/join", asker.token, {"lead": victim.id})
    assert again.status_code == 429 and again.json_body["reason"] == "team_rate"


def _invitation_answer(answer: Any, invited: Any) -> tuple[int, dict[str, Any]]:
    """A lead's answer to an invite with what names the one session invited (its id, label,
    name, and the invitation's own id and times) taken out, to compare answers about two sessions."""
    body = dict(answer.json_body)
    invitation = dict(body.get("invitation") or {})
    text = str(body.get("detail", "")).replace(str(invitation.get("id")), "I")
    for volatile in ("id", "session", "session_label", "name", "created_at", "expires_at"):
        invitation.pop(volatile, None)
    body["invitation"] = invitation
    body["detail"] = text.replace(invited.name, "X").replace(invited.ref, "R")
    for value in (invited.id, invited.name, invited.ref):
        assert value not in str(body), body
    return answer.status_code, body


def test_inviting_does_not_tell_a_lead_who_is_on_another_team_or_an_observer(api, register):
    """The attack: any token can create a team and so lead one. Eve does, and invites a session on
    another team's roster, an observer and a session on no team. Were the answers to differ (a
    409 `already_member` or `observer` for the first two), she would learn who is on some team
    and who observes, by inviting each session in turn. Every answer is the same open invitation;
    the invited session's own accept is what answers that it cannot join."""
    boss, mate, watcher, loner, eve = (register(n) for n in ("boss", "mate", "watcher", "loner", "eve"))
    theirs = api.post("teams", boss.token, {"name": "theirs"}).json_body
    assert api.post(f"teams/{theirs['id']}/members", boss.token, {"session": mate.id}).status_code == 202
    [to_mate] = api.get("teams/invitations", mate.token).json_body["invitations"]
    assert api.post(f"teams/invitations/{to_mate['id']}/accept", mate.token).status_code == 201
    assert api.post("teams/observers", watcher.token, {"target_session": boss.id}).status_code == 201
    probe = api.post("teams", eve.token, {"name": "probe"}).json_body

    invited = (mate, watcher, loner)
    answers = {
        w.name: api.post(f"teams/{probe['id']}/members", eve.token, {"session": w.id}) for w in invited
    }

    shapes = {w.name: _invitation_answer(answers[w.name], w) for w in invited}
    assert shapes["mate"] == shapes["loner"] == shapes["watcher"], shapes
    assert shapes["loner"][0] == 202
    # Each invited session is told, and its own accept answers for its own standing.
    accepted = {}
    for w in invited:
        assert any('"team_invitation"' in m["text"] for m in api.get("inbox", w.token).json_body["messages"])
        invitation = answers[w.name].json_body["invitation"]["id"]
        accepted[w.name] = api.post(f"teams/invitations/{invitation}/accept", w.token)
    assert accepted["loner"].status_code == 201, accepted["loner"].json_body
    assert accepted["mate"].status_code == 409 and accepted["mate"].json_body["reason"] == "already_member"
    assert accepted["watcher"].status_code == 409 and accepted["watcher"].json_body["reason"] == "observer"
    # The lead's own roster is the lead's to read: inviting a session already on it says so.
    again = api.post(f"teams/{probe['id']}/members", eve.token, {"session": loner.id})
    assert again.status_code == 409 and again.json_body["reason"] == "already_member"


def test_many_lead_sessions_cannot_flood_one_session_with_invitations(api, register, settings):
    """The attack: the bound on invitation notices is per inviting lead, so eve registers several
    sessions, each creates a team and invites the victim. Each opens one more invitation and writes
    one more hub notice into the victim's inbox, which no sender's share limits, until every other
    sender is refused (`recipient_queue_full`). A session holds at most
    SWITCHBOARD_INVITATIONS_PER_RECIPIENT open invitations, from all teams; past it the invite is
    refused (409 `too_many_invitations`) naming the cap, never how many others sent, and nothing
    is written."""
    settings.SWITCHBOARD_INVITATIONS_PER_RECIPIENT = 3
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 5
    victim, alice = register("victim"), register("alice")
    leads = [register(f"eve-{i}") for i in range(6)]
    teams = [api.post("teams", lead.token, {"name": f"flood {i}"}).json_body for i, lead in enumerate(leads)]

    answers = [
        api.post(f"teams/{team['id']}/members", lead.token, {"session": victim.id})
        for lead, team in zip(leads, teams, strict=True)
    ]

    assert [a.status_code for a in answers] == [202, 202, 202, 409, 409, 409]
    refused = answers[-1].json_body
    assert refused["reason"] == "too_many_invitations" and "(3)" in refused["detail"], refused
    assert not any(t["name"] in refused["detail"] for t in teams)
    assert Invitation.objects.filter(session_id=victim.id).count() == 3
    # The victim's inbox keeps room for everyone else.
    sent = api.post("messages", alice.token, {"to": victim.id, "message": "the build is green"})
    assert sent.status_code == 201, sent.json_body
    inbox = api.get("inbox", victim.token).json_body["messages"]
    assert len([m for m in inbox if '"team_invitation"' in m["text"]]) == 3
    # Answering one makes room for the next.
    declined = api.post(f"teams/invitations/{answers[0].json_body['invitation']['id']}/decline", victim.token)
    assert declined.status_code == 200
    again = api.post(f"teams/{teams[3]['id']}/members", leads[3].token, {"session": victim.id})
    assert again.status_code == 202, again.json_body


def test_an_asker_lists_and_withdraws_its_own_requests_to_join_and_nobody_else_can(api, register):
    """The asker's own requests to join: eve asks a lead and a session that leads no team. She
    lists both alike (whom she asked, nothing of a team) and withdraws them alike, which cancels
    the lead's request and its unread notice. Were only the lead's listed, or withdrawn otherwise,
    the list would map who leads what. Another session's token (even the lead's) withdrawing her
    request gets the answer an id no request has: it learns nothing of it."""
    eve, boss, loner, mallory = register("eve"), register("boss"), register("loner"), register("mallory")
    team = api.post("teams", boss.token, {"name": "secret-project"}).json_body
    asked = {
        w.name: api.post("teams/join", eve.token, {"lead": w.id}).json_body["request"] for w in (boss, loner)
    }

    listed = {r["lead"]: r for r in api.get("teams/join", eve.token).json_body["requests"]}

    assert listed == {boss.id: asked["boss"], loner.id: asked["loner"]}
    assert _without_lead({"request": asked["boss"]}, boss) == _without_lead(
        {"request": asked["loner"]}, loner
    )
    assert team["id"] not in str(listed) and "secret-project" not in str(listed)
    assert _join_requests_to(api, boss) == 1
    for stranger in (mallory, boss):
        refused = api.delete(f"teams/join/{asked['boss']['id']}", stranger.token)
        nobody = api.delete(f"teams/join/{uuid.uuid4()}", stranger.token)
        assert refused.status_code == nobody.status_code == 404
        assert refused.json_body == nobody.json_body
        assert api.get("teams/join", stranger.token).json_body["requests"] == []
    assert Invitation.objects.get(session_id=eve.id).state == "open"

    withdrawn = {w.name: api.delete(f"teams/join/{asked[w.name]['id']}", eve.token) for w in (boss, loner)}

    assert [w.status_code for w in withdrawn.values()] == [200, 200]
    assert _without_lead({"request": withdrawn["boss"].json_body}, boss) == _without_lead(
        {"request": withdrawn["loner"].json_body}, loner
    )
    assert withdrawn["boss"].json_body["state"] == "cancelled"
    assert api.get("teams/join", eve.token).json_body["requests"] == []
    assert Invitation.objects.get(session_id=eve.id).state == "cancelled"
    # The lead's notice is withdrawn, and its add no longer completes a join: it invites.
    assert _join_requests_to(api, boss) == 0
    added = api.post(f"teams/{team['id']}/members", boss.token, {"session": eve.id})
    assert added.status_code == 202 and added.json_body["member_id"] is None, added.json_body
    again = api.delete(f"teams/join/{asked['boss']['id']}", eve.token)
    assert again.status_code == 409 and again.json_body["reason"] == "stale_invitation"


def _join_requests_to(api: Any, lead: Any) -> int:
    """How many unread join-request notices wait in `lead`'s inbox (peeked, not pulled)."""
    return Delivery.objects.filter(
        recipient_id=lead.id, state="queued", message__text__contains='"team_join_request"'
    ).count()


def test_many_asker_sessions_cannot_flood_a_lead_with_join_request_notices(api, register, monkeypatch):
    """The attack: the bound on join-request notices is per asker, so eve registers many sessions
    and each asks boss to let it join. Each would write one more hub notice into boss's inbox,
    which no sender's share limits. The requests to boss's team share one notice, rewritten with
    the count of open requests as asks arrive, so boss has one unread however many ask. The
    requests themselves are not capped (a flood would then shut a genuine teammate out): mate,
    asking in the middle of the flood, is stored, listed (a page at a time) and added."""
    monkeypatch.setattr(invitations, "INVITATIONS_PAGE", 3)
    boss, mate = register("boss"), register("mate")
    team = api.post("teams", boss.token, {"name": "flood"}).json_body
    eves = [register(f"eve-{i}") for i in range(8)]

    asked = [api.post("teams/join", eve.token, {"lead": boss.id}) for eve in eves[:4]]
    asked.append(api.post("teams/join", mate.token, {"lead": boss.id}))
    asked += [api.post("teams/join", eve.token, {"lead": boss.id}) for eve in eves[4:]]

    assert [a.status_code for a in asked] == [202] * 9
    assert _join_requests_to(api, boss) == 1
    [notice] = [
        m for m in api.get("inbox", boss.token).json_body["messages"] if "team_join_request" in m["text"]
    ]
    frame = json.loads(notice["text"])
    assert frame["open_requests"] == 9 and frame["session"] == f"{eves[-1].name} [{eves[-1].ref}]", frame
    assert (
        "9 sessions ask to join your team" in frame["detail"]
        and "GET /api/v1/teams/invitations" in frame["detail"]
    )
    listed, pages = _all_invitations(api, boss)
    assert pages == 3 and len(listed) == 9 == len({i["id"] for i in listed})
    [to_mate] = [i for i in listed if i["session"] == mate.id]
    assert to_mate["answer_by"] == "lead"
    added = api.post(f"teams/{team['id']}/members", boss.token, {"session": mate.id})
    assert added.status_code == 201, added.json_body
    assert api.get("teams/join", mate.token).json_body["requests"] == []
    assert len(_all_invitations(api, boss)[0]) == 8


def _all_invitations(api: Any, agent: Any) -> tuple[list[dict[str, Any]], int]:
    """Every open invitation `agent` sees, following the pages: (them, how many pages)."""
    listed: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    for pages in range(1, 20):
        page = api.get("teams/invitations", agent.token, **params).json_body
        listed += page["invitations"]
        if page["next"] is None:
            return listed, pages
        params = {"before": page["next"]}
    raise AssertionError("the pages of invitations never end")
