"""What one session's token reaches through the team surface (round 2): each test performs the
attack with a session that holds its own token only, through the hub's real API."""

from __future__ import annotations

from typing import Any

import pytest

from teams.models import Invitation

pytestmark = pytest.mark.django_db


def _without_lead(body: dict[str, Any], lead: Any) -> dict[str, Any]:
    """An answer with the asked session's own label taken out, to compare answers about two leads."""
    return {
        k: (v.replace(lead.name, "X").replace(lead.ref, "R") if isinstance(v, str) else v)
        for k, v in body.items()
    }


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
