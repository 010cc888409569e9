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
        added = api.post(f"teams/{team_id}/members", lead.token, {"session": agent.id})
        assert added.status_code == 201, added.json_body
        members[agent.name] = added.json_body["member_id"]
    return Crew(team_id=team_id, lead=lead, alice=alice, bob=bob, members=members)


def frames_in(api: Any, agent: Any, frame_type: str | None = None) -> list[dict[str, Any]]:
    """Pull an agent's inbox and return its messages, with each frame's JSON parsed as `frame`."""
    messages = api.get("inbox", agent.token).json_body["messages"]
    for m in messages:
        if m["kind"] == "frame":
            m["frame"] = json.loads(m["text"])
    if frame_type:
        return [m for m in messages if m.get("frame_type") == frame_type]
    return messages
