"""Asks to join that race other changes of the same team: other asks (the lead keeps one unread
notice; each ask rewrites it under the team's lock, `teams.services.invitations._lock_team`) and
the team ending."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection, connections

from messaging.models import AgentSession, Delivery
from messaging.principals import HUB, session_principal
from messaging.services.sessions import session_register
from teams.models import Invitation, JoinRequest, Team
from teams.services import invitations
from teams.services.invitations import team_ask_to_join
from teams.services.teams import team_create, team_end

ASKERS = 8
WAIT = 30  # seconds a racer waits at most for the others


@pytest.mark.django_db(transaction=True)
def test_asks_at_the_same_moment_leave_the_lead_one_unread_notice():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writer at a time: nothing to race")
    lead = session_register(name="lead-r").session
    team_create(lead=lead, name="r", actor=session_principal(lead))
    askers = [session_register(name=f"asker-{i}").session for i in range(ASKERS)]
    start = threading.Barrier(ASKERS, timeout=WAIT)

    def ask(asker: AgentSession) -> str:
        try:
            start.wait()
            request, _ = team_ask_to_join(lead=lead, actor=session_principal(asker))
            return request.state
        finally:
            connections.close_all()

    with ThreadPoolExecutor(ASKERS) as pool:
        states = list(pool.map(ask, askers, timeout=WAIT))

    assert states == ["open"] * ASKERS
    unread = Delivery.objects.filter(
        recipient=lead, state="queued", message__text__contains='"team_join_request"'
    )
    assert unread.count() == 1


@pytest.mark.django_db
def test_an_ask_while_its_lead_ends_the_team_answers_as_for_a_session_that_leads_none(
    api, register, monkeypatch
):
    """The team ends between the ask finding it live and writing the lead's request: the ask
    must not write a request to an ended team (or fail looking for its gone lead); it answers, as
    for a session that leads no team, with the asker's own request and nothing of the team."""
    lead, asker = register("lead-e"), register("asker-e")
    team = api.post("teams", lead.token, {"name": "ending"}).json_body
    checked = invitations.roster_check_joinable

    def end_first(**kwargs: Any) -> Any:
        answer = checked(**kwargs)
        team_end(team=Team.objects.get(pk=team["id"]), actor=HUB, why="ended meanwhile")
        return answer

    monkeypatch.setattr(invitations, "roster_check_joinable", end_first)
    asked = api.post("teams/join", asker.token, {"lead": lead.id})

    assert asked.status_code == 202, asked.json_body
    assert team["id"] not in str(asked.json_body) and "ending" not in str(asked.json_body)
    assert not Invitation.objects.filter(team_id=team["id"]).exists()
    [request] = JoinRequest.objects.filter(asker_id=asker.id)
    assert request.state == "open" and request.invitation_id is None


def test_an_ask_whose_invitation_is_withdrawn_meanwhile_is_an_ask_like_any_other(api, register, monkeypatch):
    """The lead withdraws its invitation between the ask finding it open and accepting it: the
    ask must not fail (it used to answer 500); it goes on as an ask by a session not invited,
    with the asker's own request and the lead's request to answer."""
    lead, asker = register("lead-w"), register("asker-w")
    team = api.post("teams", lead.token, {"name": "withdrawing"}).json_body
    invited = api.post(f"teams/{team['id']}/members", lead.token, {"session": asker.id}).json_body
    found = invitations._invited

    def withdraw_after(**kwargs: Any) -> bool:
        answer = found(**kwargs)
        assert api.delete(f"teams/invitations/{invited['invitation']['id']}", lead.token).status_code == 200
        return answer

    monkeypatch.setattr(invitations, "_invited", withdraw_after)
    asked = api.post("teams/join", asker.token, {"lead": lead.id})

    assert asked.status_code == 202, asked.json_body
    [request] = JoinRequest.objects.filter(asker_id=asker.id)
    assert request.state == "open" and request.invitation is not None
    assert request.invitation.asked_by == "session" and request.invitation.state == "open"


def test_requests_to_join_long_closed_or_lapsed_are_deleted(api, register, settings):
    """Every ask writes the asker's request, asks to sessions that lead no team included; only
    open ones are listed. Those closed or lapsed for an invitation period go with the sweep, so
    one asker's rows do not pile up for as long as it lives; an open one stays."""
    from datetime import timedelta

    from django.utils import timezone

    from teams.services.invitations import join_requests_purge

    asker, others = register("asker-p"), [register(f"nobody-{n}") for n in range(3)]
    for other in others:
        assert api.post("teams/join", asker.token, {"lead": other.id}).status_code == 202
    [withdrawn, *_] = JoinRequest.objects.filter(asker_id=asker.id)
    assert api.delete(f"teams/join/{withdrawn.id}", asker.token).status_code == 200
    assert join_requests_purge() == 0

    period = timedelta(seconds=settings.SWITCHBOARD_TEAM_INVITATION_SECONDS)
    assert join_requests_purge(now=timezone.now() + period + timedelta(minutes=1)) == 1  # the withdrawn
    assert join_requests_purge(now=timezone.now() + 2 * period + timedelta(minutes=1)) == 2  # lapsed
    fresh = api.post("teams/join", asker.token, {"lead": others[0].id})
    assert fresh.status_code == 202 and join_requests_purge() == 0
    assert JoinRequest.objects.filter(asker_id=asker.id).count() == 1
