"""A team's export: the messages among its roster (the lead included), and no one else's."""

from __future__ import annotations

import json
import uuid

import pytest

from messaging.errors import NotFound
from messaging.principals import operator_principal
from messaging.services.export import export_stream
from teams.services.export import team_export_scope

OP = operator_principal("op")


def _records(scope):
    return [json.loads(line) for line in "".join(export_stream(scope, fmt="jsonl", actor=OP)).splitlines()]


def test_a_team_export_holds_messages_among_the_roster_and_the_lead(crew, register, send):
    outsider = register("mallory")
    assert send(crew.lead, "alice", "alice, take task 1").status_code == 201
    assert send(crew.alice, "bob", "bob, review please").status_code == 201
    assert send(crew.bob, "lead-one", "reviewed").status_code == 201
    assert send(outsider, "alice", "from outside").status_code == 201
    assert send(crew.alice, "mallory", "to outside").status_code == 201

    records = _records(team_export_scope(team_id=crew.team_id))

    texts = [r["text"] for r in records if r["kind"] == "text"]
    assert texts == ["alice, take task 1", "bob, review please", "reviewed"]
    everyone = {crew.lead.ref, crew.alice.ref, crew.bob.ref}
    for r in records:
        assert r["sender"]["ref"] in everyone
        assert {p["ref"] for p in r["recipients"]} <= everyone


def test_an_unknown_team_is_not_found(db):
    with pytest.raises(NotFound):
        team_export_scope(team_id=uuid.uuid4())
    with pytest.raises(NotFound):
        team_export_scope(team_id="not-a-uuid")
