"""Leads of many teams inviting one session at the same moment: the session's cap on open
invitations (SWITCHBOARD_INVITATIONS_PER_RECIPIENT) holds however the invites interleave, because
the count and the write happen under one lock per invited session
(`teams.services.invitations._require_room_for_invitation`)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from messaging.errors import Conflict
from messaging.models import AgentSession
from messaging.principals import session_principal
from messaging.services.sessions import session_register
from teams.models import Invitation
from teams.services.invitations import team_invite
from teams.services.teams import team_create

LEADS = 8
CAP = 2
ROUNDS = 3  # a fresh invited session each round; one round over the cap is a failure
WAIT = 30  # seconds a racer waits at most for the others


@pytest.mark.django_db(transaction=True)
def test_leads_inviting_one_session_at_the_same_moment_never_pass_its_cap(settings):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writer at a time: nothing to race")
    settings.SWITCHBOARD_INVITATIONS_PER_RECIPIENT = CAP
    leads = [session_register(name=f"lead-{i}").session for i in range(LEADS)]
    teams = [
        team_create(lead=lead, name=f"t{i}", actor=session_principal(lead)) for i, lead in enumerate(leads)
    ]

    for round_ in range(ROUNDS):
        invited = session_register(name=f"invited-{round_}").session
        start = threading.Barrier(LEADS, timeout=WAIT)

        def invite(n: int, invited: AgentSession = invited, start: threading.Barrier = start) -> str:
            try:
                start.wait()
                team_invite(team=teams[n], session=invited, actor=session_principal(leads[n]))
                return "open"
            except Conflict as exc:
                return exc.extra["reason"]
            finally:
                connections.close_all()

        with ThreadPoolExecutor(LEADS) as pool:
            answers = list(pool.map(invite, range(LEADS), timeout=WAIT))

        opened = Invitation.objects.filter(session=invited, state="open").count()
        assert opened == CAP, (round_, answers)
        assert sorted(answers) == ["open"] * CAP + ["too_many_invitations"] * (LEADS - CAP), answers
