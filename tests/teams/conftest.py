"""Fixtures for team tests: a lead with two teammates, built through the REST API."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class Crew:
    """A team as its members see it: the team id, the agents, and their member ids."""

    team_id: str
    lead: Any
    alice: Any
    bob: Any
    members: dict[str, str]  # agent name -> member id

    def path(self, rest: str = "") -> str:
        return f"teams/{self.team_id}{rest}"


@pytest.fixture
def crew(api: Any, register: Callable[..., Any]) -> Crew:
    """A lead session with a team and two teammates, alice and bob (all idle, all fresh)."""
    lead, alice, bob = register("lead-one"), register("alice"), register("bob")
    created = api.post("teams", lead.token, {"name": "build"})
    assert created.status_code == 201, created.json_body
    team_id = created.json_body["id"]
    members = {"lead-one": created.json_body["members"][0]["member_id"]}
    for agent in (alice, bob):
        members[agent.name] = join_team(api, lead, team_id, agent)["member_id"]
    return Crew(team_id=team_id, lead=lead, alice=alice, bob=bob, members=members)


def join_team(api: Any, lead: Any, team_id: str, agent: Any, **fields: Any) -> dict[str, Any]:
    """The lead invites `agent` and `agent` accepts: its roster entry (a lead cannot add alone)."""
    invited = api.post(f"teams/{team_id}/members", lead.token, {"session": agent.id, **fields})
    assert invited.status_code == 202, invited.json_body
    accepted = api.post(f"teams/invitations/{invited.json_body['invitation']['id']}/accept", agent.token)
    assert accepted.status_code == 201, accepted.json_body
    return accepted.json_body


def frames_in(api: Any, agent: Any, frame_type: str | None = None) -> list[dict[str, Any]]:
    """Pull an agent's inbox and return its messages, with each frame's JSON parsed as `frame`."""
    messages = api.get("inbox", agent.token).json_body["messages"]
    for m in messages:
        if m["kind"] == "frame":
            m["frame"] = json.loads(m["text"])
    if frame_type:
        return [m for m in messages if m.get("frame_type") == frame_type]
    return messages
