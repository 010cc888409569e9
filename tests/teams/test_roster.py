"""Teams and the roster: one team per lead, no nesting, member ids, `lead`, stale members, ending."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.utils import timezone

from messaging.models import AuditEvent, Delivery, Message
from teams.models import Invitation, JoinRequest, Task
from teams.tasks import sweep_teams
from tests.teams.conftest import join_team


def test_lead_creates_team_and_adds_teammates_with_their_own_member_ids(api, crew):
    team = api.get(crew.path(), crew.lead.token).json_body
    roster = {m["name"]: m for m in team["members"]}
    assert set(roster) == {"lead-one", "alice", "bob"}
    assert roster["lead-one"]["role"] == "lead"
    assert roster["alice"]["role"] == "teammate"
    assert roster["alice"]["member_id"] != roster["alice"]["session"]["id"]
    assert AuditEvent.objects.filter(kind="team.member_joined").count() == 2


def test_a_session_leads_one_team_and_a_teammate_cannot_create_one(api, crew):
    again = api.post("teams", crew.lead.token, {"name": "second"})
    assert again.status_code == 409
    assert again.json_body["reason"] == "already_lead"
    nested = api.post("teams", crew.alice.token, {"name": "nested"})
    assert nested.status_code == 403
    assert nested.json_body["reason"] == "nested_team"


def test_only_the_lead_adds_members_and_a_member_is_on_one_roster(api, crew, register):
    carol = register("carol")
    assert api.post(crew.path("/members"), crew.alice.token, {"session": carol.id}).status_code == 403
    other_lead = register("other-lead")
    other = api.post("teams", other_lead.token, {}).json_body["id"]
    # Another lead may invite alice (who is on which roster is not its to learn); her accept is
    # refused while she is on a roster, and the invitation stays open.
    invited = api.post(f"teams/{other}/members", other_lead.token, {"session": crew.alice.id})
    assert invited.status_code == 202, invited.json_body
    invitation = invited.json_body["invitation"]["id"]
    taken = api.post(f"teams/invitations/{invitation}/accept", crew.alice.token)
    assert taken.status_code == 409 and taken.json_body["reason"] == "already_member"
    [still] = api.get("teams/invitations", crew.alice.token).json_body["invitations"]
    assert (still["id"], still["state"]) == (invitation, "open")


def test_lead_alias_reaches_the_senders_lead(api, crew, send):
    sent = send(crew.alice, "lead", "status: halfway")
    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["to"]["id"] == crew.lead.id


def test_a_stale_member_id_is_refused_even_when_its_name_is_reused(api, crew, register):
    old_bob = crew.members["bob"]
    assert api.delete(crew.path(f"/members/{old_bob}"), crew.bob.token).status_code == 200
    new_bob = register("bob")
    added = join_team(api, crew.lead, crew.team_id, new_bob, name="bob")

    stale = api.post(crew.path("/messages"), crew.lead.token, {"to_member": old_bob, "message": "ship it"})
    assert stale.status_code == 409
    assert stale.json_body["reason"] == "stale_member"
    assert api.get("inbox", new_bob.token).json_body["messages"] == []

    fresh = api.post(
        crew.path("/messages"), crew.lead.token, {"to_member": added["member_id"], "message": "hi"}
    )
    assert fresh.status_code == 201
    assert fresh.json_body["to"]["id"] == new_bob.id


def test_leaving_returns_unfinished_tasks_to_the_board(api, crew):
    task = api.post(crew.path("/tasks"), crew.lead.token, {"title": "write docs"}).json_body
    assert api.post(f"tasks/{task['id']}/claim", crew.alice.token, {}).status_code == 200
    api.delete(crew.path(f"/members/{crew.members['alice']}"), crew.alice.token)
    after = api.get(f"tasks/{task['id']}", crew.lead.token).json_body
    assert after["status"] == "pending" and after["owner"] is None


def test_a_teammate_cannot_remove_another(api, crew):
    assert api.delete(crew.path(f"/members/{crew.members['bob']}"), crew.alice.token).status_code == 403


def test_ending_a_team_keeps_tasks_and_frees_the_lead(api, crew):
    api.post(crew.path("/tasks"), crew.lead.token, {"title": "kept"})
    assert api.post(crew.path("/end"), crew.alice.token).status_code == 403
    ended = api.post(crew.path("/end"), crew.lead.token)
    assert ended.status_code == 200 and ended.json_body["live"] is False
    assert Task.objects.filter(team_id=crew.team_id).count() == 1
    assert api.get(crew.path("/tasks"), crew.lead.token).json_body["tasks"][0]["title"] == "kept"
    assert api.post(crew.path("/tasks"), crew.lead.token, {"title": "late"}).status_code == 409
    assert api.post("teams", crew.lead.token, {"name": "next"}).status_code == 201
    assert api.post("teams", crew.alice.token, {"name": "alice's own"}).status_code == 201


def test_outsiders_cannot_see_a_team_but_operators_can(api, crew, register, operator_token):
    stranger = register("stranger")
    assert api.get(crew.path(), stranger.token).status_code == 404
    assert api.get(crew.path(), operator_token).status_code == 200
    assert len(api.get("teams", operator_token).json_body["teams"]) == 1
    assert api.get("teams", stranger.token).json_body["teams"] == []


def test_exit_takes_a_teammate_off_the_roster_and_tells_the_lead(api, crew):
    assert api.delete("sessions/me", crew.bob.token).status_code == 200
    names = {m["name"] for m in api.get(crew.path(), crew.lead.token).json_body["members"]}
    assert names == {"lead-one", "alice"}
    texts = [m["text"] for m in api.get("inbox", crew.lead.token).json_body["messages"]]
    assert any("bob" in t and "exited" in t for t in texts)


def test_roster_and_board_changes_are_announced_to_the_team_group(
    api, crew, monkeypatch, django_capture_on_commit_callbacks
):
    from messaging.services import events

    sent: list[tuple[list[str], str]] = []
    monkeypatch.setattr(events, "_send", lambda groups, event: sent.append((groups, event["kind"])))
    with django_capture_on_commit_callbacks(execute=True):
        task = api.post(crew.path("/tasks"), crew.lead.token, {"title": "watched"}).json_body
        api.post(f"tasks/{task['id']}/claim", crew.alice.token, {})
        api.delete(crew.path(f"/members/{crew.members['bob']}"), crew.bob.token)
    group = f"team.{crew.team_id}"
    kinds = [kind for groups, kind in sent if group in groups and "operators" in groups]
    assert kinds == ["task.changed", "task.changed", "team.changed"]


def test_ended_teams_are_purged_after_the_retention_period(api, crew, settings):
    from datetime import timedelta

    from django.utils import timezone

    from teams.models import Team
    from teams.services.teams import teams_purge_ended

    api.post(crew.path("/tasks"), crew.lead.token, {"title": "old"})
    api.post(crew.path("/end"), crew.lead.token)
    assert teams_purge_ended() == 0
    later = timezone.now() + timedelta(days=settings.SWITCHBOARD_TEAM_RETENTION_DAYS, minutes=1)
    assert teams_purge_ended(now=later) == 1
    assert not Team.objects.exists() and not Task.objects.exists()


def test_malformed_ids_get_the_json_error_shape(api, crew):
    for path in ("teams/not-a-team", "tasks/not-a-task", f"teams/{crew.team_id}/members/xyz/shutdown"):
        response = api.call("GET" if "shutdown" not in path else "POST", path, crew.lead.token, {})
        assert response.status_code in (400, 404), (path, response.status_code)
        assert response.json_body["error"] in ("invalid", "not_found")


def test_an_askers_request_closes_when_its_lead_answers_and_stands_while_its_team_ends(api, register):
    """The asker's request to join follows what it is told: the lead's decline closes it (the
    asker hears of it); a team that ends says nothing to the asker, so its request stays listed,
    as one to a session that leads no team does, until it lapses or the asker withdraws it."""
    lead, asker = register("lead-j"), register("asker-j")
    team = api.post("teams", lead.token, {"name": "j"}).json_body
    first = api.post("teams/join", asker.token, {"lead": lead.id}).json_body["request"]
    [invitation] = api.get("teams/invitations", lead.token).json_body["invitations"]
    assert api.post(f"teams/invitations/{invitation['id']}/decline", lead.token).status_code == 200

    assert api.get("teams/join", asker.token).json_body["requests"] == []
    stale = api.delete(f"teams/join/{first['id']}", asker.token)
    assert stale.status_code == 409 and "declined" in stale.json_body["detail"]

    second = api.post("teams/join", asker.token, {"lead": lead.id}).json_body["request"]
    assert second["id"] != first["id"]
    again = api.post("teams/join", asker.token, {"lead": lead.id}).json_body["request"]
    assert again == second  # asking twice is the same request
    assert api.post(f"teams/{team['id']}/end", lead.token).status_code == 200
    assert [r["id"] for r in api.get("teams/join", asker.token).json_body["requests"]] == [second["id"]]
    withdrawn = api.delete(f"teams/join/{second['id']}", asker.token)
    assert withdrawn.status_code == 200 and withdrawn.json_body["state"] == "cancelled"


def _asks_notices(lead: Any) -> list[dict[str, Any]]:
    """The lead's join-request notices still unread (peeked, not pulled), each as its frame."""
    rows = Delivery.objects.filter(
        recipient_id=lead.id, state="queued", message__text__contains='"team_join_request"'
    ).select_related("message")
    return [json.loads(d.message.text) for d in rows]


def test_a_leads_one_notice_of_requests_to_join_follows_them_as_they_come_and_go(api, register):
    """The lead has one unread notice of the requests to its team: each ask rewrites it with the
    count and the newest asker; once the lead has read it, the next ask writes a new one; a request
    that closes rewrites it only while unread, and the last to close withdraws it, so it never asks
    for an answer to a request that no longer stands. Ending the team withdraws it too."""
    lead, ann, ben, cat = register("lead-n"), register("ann"), register("ben"), register("cat")
    team = api.post("teams", lead.token, {"name": "n"}).json_body
    api.post("teams/join", ann.token, {"lead": lead.id})
    [one] = _asks_notices(lead)
    assert (
        one["open_requests"] == 1 and one["session"].startswith("ann [") and "asks to join" in one["detail"]
    )

    api.post("teams/join", ben.token, {"lead": lead.id})
    [two] = _asks_notices(lead)
    assert (two["open_requests"], two["session"][:3]) == (2, "ben")
    api.get("inbox", lead.token)  # the lead reads it
    assert _asks_notices(lead) == []
    asked = api.post("teams/join", cat.token, {"lead": lead.id}).json_body["request"]
    [three] = _asks_notices(lead)
    assert three["open_requests"] == 3 and "3 sessions ask to join your team" in three["detail"]

    assert api.delete(f"teams/join/{asked['id']}", cat.token).status_code == 200
    [after_withdrawal] = _asks_notices(lead)
    assert (after_withdrawal["open_requests"], after_withdrawal["session"][:3]) == (2, "ben")
    declined = api.post(f"teams/invitations/{after_withdrawal['invitation_id']}/decline", lead.token)
    assert declined.status_code == 200
    [after_decline] = _asks_notices(lead)
    assert (after_decline["open_requests"], after_decline["session"][:3]) == (1, "ann")
    added = api.post(f"teams/{team['id']}/members", lead.token, {"session": ann.id})
    assert added.status_code == 201
    assert _asks_notices(lead) == []

    api.get("inbox", lead.token)
    api.post("teams/join", ben.token, {"lead": lead.id})
    api.post("teams/join", cat.token, {"lead": lead.id})
    api.get("inbox", lead.token)  # read: closing a request now writes nothing
    assert api.post(f"teams/{team['id']}/members", lead.token, {"session": ben.id}).status_code == 201
    assert _asks_notices(lead) == []
    api.post("teams/join", register("dot").token, {"lead": lead.id})
    assert len(_asks_notices(lead)) == 1
    written = Message.objects.filter(text__contains='"team_join_request"').count()
    assert api.post(f"teams/{team['id']}/end", lead.token).status_code == 200
    assert _asks_notices(lead) == []
    assert Message.objects.filter(text__contains='"team_join_request"').count() == written


def _invitation_notices(session: Any) -> list[dict[str, Any]]:
    """The session's invitation notices still unread (peeked, not pulled), each as its frame."""
    rows = Delivery.objects.filter(
        recipient_id=session.id, state="queued", message__text__contains='"team_invitation"'
    ).select_related("message")
    return [json.loads(d.message.text) for d in rows]


def _lapse_all() -> None:
    """Every invitation and request to join reaches its expiry now."""
    past = timezone.now() - timedelta(seconds=1)
    Invitation.objects.update(expires_at=past)
    JoinRequest.objects.update(expires_at=past)


def test_invitations_that_lapse_take_their_unread_notices_with_them(api, register):
    """An invitation stands until its expiry; past it, the notice asking for an answer must not
    wait unread for a session to act on an invitation that no longer exists. The teams sweep
    closes lapsed invitations as `expired` and withdraws the invited session's notice; a lapsed
    request to join leaves the lead's notice of requests rewritten without it, or withdrawn."""
    lead, invited, asker = register("lead-x"), register("invited-x"), register("asker-x")
    team = api.post("teams", lead.token, {"name": "x"}).json_body
    assert api.post(f"teams/{team['id']}/members", lead.token, {"session": invited.id}).status_code == 202
    assert api.post("teams/join", asker.token, {"lead": lead.id}).status_code == 202
    assert len(_invitation_notices(invited)) == 1 and len(_asks_notices(lead)) == 1

    _lapse_all()
    swept = sweep_teams()

    assert swept["invitations_expired"] == 2
    assert set(Invitation.objects.values_list("state", flat=True)) == {"expired"}
    assert _invitation_notices(invited) == [] and _asks_notices(lead) == []
    inbox = api.get("inbox", invited.token).json_body["messages"]
    assert not any('"team_invitation"' in m["text"] for m in inbox)
    assert AuditEvent.objects.filter(kind="team.invitation_expired").count() == 2
    assert sweep_teams()["invitations_expired"] == 0


def test_an_answer_to_a_lapsed_invitation_withdraws_its_notice_before_the_sweep_does(api, register):
    """The session answers after the expiry but before the sweep: it is told the invitation
    expired, and the notice goes as the sweep would have taken it. Inviting it again writes one
    notice of the new invitation, not a second one beside the lapsed one's."""
    lead, invited = register("lead-y"), register("invited-y")
    team = api.post("teams", lead.token, {"name": "y"}).json_body
    first = api.post(f"teams/{team['id']}/members", lead.token, {"session": invited.id}).json_body
    _lapse_all()

    late = api.post(f"teams/invitations/{first['invitation']['id']}/accept", invited.token)

    assert late.status_code == 409 and "expired" in late.json_body["detail"], late.json_body
    assert _invitation_notices(invited) == []
    again = api.post(f"teams/{team['id']}/members", lead.token, {"session": invited.id}).json_body
    [notice] = _invitation_notices(invited)
    assert notice["invitation_id"] == again["invitation"]["id"] != first["invitation"]["id"]
    assert AuditEvent.objects.filter(kind="team.invitation_expired").count() == 1
