"""The task board: dependencies and cycles, claiming, claim-next, assignment, unblocking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from teams.services.tasks import would_cycle
from tests.teams.conftest import frames_in


def _task(api, crew, title, token=None, blocked_by=()):
    made = api.post(
        crew.path("/tasks"), token or crew.lead.token, {"title": title, "blocked_by": list(blocked_by)}
    )
    assert made.status_code == 201, made.json_body
    return made.json_body


def test_a_dependency_that_closes_a_cycle_is_refused(api, crew):
    a = _task(api, crew, "a")
    b = _task(api, crew, "b", blocked_by=[a["id"]])
    c = _task(api, crew, "c", blocked_by=[b["id"]])
    looped = api.patch(f"tasks/{a['id']}", crew.lead.token, {"add_blocked_by": [c["id"]]})
    assert looped.status_code == 400 and looped.json_body["reason"] == "dependency_cycle"
    itself = api.patch(f"tasks/{a['id']}", crew.lead.token, {"add_blocked_by": [a["id"]]})
    assert itself.status_code == 400 and itself.json_body["reason"] == "dependency_cycle"
    fine = api.patch(f"tasks/{c['id']}", crew.lead.token, {"add_blocked_by": [a["id"]]})
    assert fine.status_code == 200 and fine.json_body["blocked_by"] == sorted([a["id"], b["id"]])


@pytest.mark.parametrize(
    ("edges", "task", "blockers", "expected"),
    [
        ({}, 1, {2}, False),
        ({2: {1}}, 1, {2}, True),
        ({2: {3}, 3: {4}}, 4, {1}, False),
        ({2: {3}, 3: {4}}, 4, {2}, True),
        ({2: {3}, 3: {2}}, 1, {2}, False),  # an existing loop elsewhere does not hang the check
    ],
)
def test_cycle_detection(edges, task, blockers, expected):
    assert would_cycle(edges=edges, task=task, blockers=blockers) is expected


def test_blocked_tasks_cannot_be_claimed_until_their_blockers_complete(api, crew):
    first = _task(api, crew, "schema")
    second = _task(api, crew, "migration", blocked_by=[first["id"]])
    assert second["blocked"] is True
    refused = api.post(f"tasks/{second['id']}/claim", crew.alice.token, {})
    assert refused.status_code == 409 and "blocked" in refused.json_body["detail"]

    assert api.post(f"tasks/{first['id']}/claim", crew.bob.token, {}).status_code == 200
    done = api.post(f"tasks/{first['id']}/complete", crew.bob.token, {"result": "schema merged"})
    assert done.status_code == 200 and done.json_body["status"] == "completed"
    assert api.get(f"tasks/{second['id']}", crew.alice.token).json_body["blocked"] is False
    assert api.post(f"tasks/{second['id']}/claim", crew.alice.token, {}).json_body["status"] == "in_progress"


def test_a_claimed_task_has_one_owner_and_others_are_told_who(api, crew):
    task = _task(api, crew, "only one")
    won = api.post(f"tasks/{task['id']}/claim", crew.alice.token, {})
    assert won.status_code == 200 and won.json_body["owner"]["name"] == "alice"
    lost = api.post(f"tasks/{task['id']}/claim", crew.bob.token, {})
    assert lost.status_code == 409
    assert lost.json_body["reason"] == "not_claimable" and "alice" in lost.json_body["detail"]


def test_claim_with_a_stale_revision_is_refused(api, crew):
    task = _task(api, crew, "revisioned")
    stale = api.post(
        f"tasks/{task['id']}/claim", crew.alice.token, {"expected_revision": task["revision"] + 5}
    )
    assert stale.status_code == 409
    ok = api.post(f"tasks/{task['id']}/claim", crew.alice.token, {"expected_revision": task["revision"]})
    assert ok.status_code == 200 and ok.json_body["revision"] == task["revision"] + 1


def test_claim_next_takes_the_oldest_unblocked_task_then_none(api, crew):
    a = _task(api, crew, "a")
    _task(api, crew, "b", blocked_by=[a["id"]])
    c = _task(api, crew, "c")
    assert api.post("tasks/claim-next", crew.alice.token).json_body["task"]["id"] == a["id"]
    assert api.post("tasks/claim-next", crew.bob.token).json_body["task"]["id"] == c["id"]
    assert api.post("tasks/claim-next", crew.bob.token).json_body["task"] is None


def test_completing_the_last_blocker_tells_the_dependants_owner(api, crew):
    a = _task(api, crew, "a")
    b = _task(api, crew, "b")
    waiting = _task(api, crew, "after a and b", blocked_by=[a["id"], b["id"]])
    assigned = api.post(f"tasks/{waiting['id']}/assign", crew.lead.token, {"member_id": crew.members["bob"]})
    assert assigned.json_body["status"] == "pending" and assigned.json_body["owner"]["name"] == "bob"
    frames_in(api, crew.bob)  # drain the assignment

    api.post(f"tasks/{a['id']}/claim", crew.alice.token, {})
    api.post(f"tasks/{a['id']}/complete", crew.alice.token, {})
    assert frames_in(api, crew.bob) == []  # still blocked by b

    api.post(f"tasks/{b['id']}/claim", crew.alice.token, {})
    api.post(f"tasks/{b['id']}/complete", crew.alice.token, {})
    told = frames_in(api, crew.bob)
    assert len(told) == 1 and told[0]["kind"] == "notification"
    assert told[0]["from"] is None and "FROM=hub" in told[0]["marker"]  # a hub fact, not a peer's word
    assert f"Task {waiting['id']} is unblocked" in told[0]["summary"]
    assert api.get(f"tasks/{waiting['id']}", crew.bob.token).json_body["status"] == "in_progress"


def test_assignment_by_the_lead_sends_a_task_assignment_frame(api, crew):
    task = _task(api, crew, "review")
    assert (
        api.post(
            f"tasks/{task['id']}/assign", crew.alice.token, {"member_id": crew.members["bob"]}
        ).status_code
        == 403
    )
    assigned = api.post(f"tasks/{task['id']}/assign", crew.lead.token, {"member_id": crew.members["bob"]})
    assert assigned.status_code == 200 and assigned.json_body["status"] == "in_progress"
    [frame] = frames_in(api, crew.bob, "task_assignment")
    assert frame["frame"]["task"]["id"] == task["id"]
    assert frame["from"]["id"] == crew.lead.id
    assert "FRAME=task_assignment" in frame["marker"]


def test_assignment_by_an_operator_is_told_by_the_hub_never_in_the_leads_name(api, crew, operator_token):
    """The recipient believes who said what: an operator's assignment does not read as the lead's
    (a `task_assignment` frame from the lead's session); the hub tells it, naming the operator."""
    import json

    task = _task(api, crew, "hotfix")
    assigned = api.post(f"tasks/{task['id']}/assign", operator_token, {"member_id": crew.members["bob"]})
    assert assigned.status_code == 200, assigned.json_body
    [told] = [m for m in frames_in(api, crew.bob) if str(task["id"]) in m["text"]]
    assert told["from"] is None and "FROM=hub" in told["marker"], told["marker"]
    body = json.loads(told["text"])
    assert body["type"] == "task_assignment" and body["task"]["id"] == task["id"]
    assert body["assigned_by"] == "operator:test-operator"


def test_only_the_owner_completes_and_only_in_progress_tasks(api, crew):
    task = _task(api, crew, "mine")
    assert api.post(f"tasks/{task['id']}/complete", crew.alice.token, {}).status_code == 403
    api.post(f"tasks/{task['id']}/claim", crew.alice.token, {})
    assert api.post(f"tasks/{task['id']}/complete", crew.bob.token, {}).status_code == 403
    assert api.post(f"tasks/{task['id']}/complete", crew.alice.token, {}).status_code == 200
    again = api.post(f"tasks/{task['id']}/complete", crew.alice.token, {})
    assert again.status_code == 409


def test_release_puts_a_task_back(api, crew):
    task = _task(api, crew, "too big")
    api.post(f"tasks/{task['id']}/claim", crew.alice.token, {})
    released = api.post(f"tasks/{task['id']}/release", crew.alice.token)
    assert released.json_body["status"] == "pending" and released.json_body["owner"] is None
    assert api.post(f"tasks/{task['id']}/claim", crew.bob.token, {}).status_code == 200


def test_outsiders_cannot_see_or_touch_the_board(api, crew, register):
    task = _task(api, crew, "private")
    stranger = register("stranger")
    assert api.get(f"tasks/{task['id']}", stranger.token).status_code == 404
    assert api.post(f"tasks/{task['id']}/claim", stranger.token, {}).status_code == 404
    # A team it does not read answers as one that does not exist (team_get_visible).
    assert api.post(crew.path("/tasks"), stranger.token, {"title": "x"}).status_code == 404


def _acyclic(edges: dict[int, set[int]]) -> bool:
    """Kahn's algorithm: the graph has no cycle when every node can be peeled off."""
    nodes = set(edges) | {b for bs in edges.values() for b in bs}
    waiting = {n: len(edges.get(n, ())) for n in nodes}
    dependants: dict[int, set[int]] = {}
    for task, blockers in edges.items():
        for b in blockers:
            dependants.setdefault(b, set()).add(task)
    ready = [n for n, count in waiting.items() if count == 0]
    peeled = 0
    while ready:
        node = ready.pop()
        peeled += 1
        for d in dependants.get(node, ()):
            waiting[d] -= 1
            if waiting[d] == 0:
                ready.append(d)
    return peeled == len(nodes)


@given(
    pairs=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20),
    task=st.integers(0, 7),
    blockers=st.sets(st.integers(0, 7), min_size=1, max_size=3),
)
def test_would_cycle_agrees_with_a_topological_sort(pairs, task, blockers):
    edges: dict[int, set[int]] = {}
    for a, b in pairs:  # build an acyclic board the way the service would: refuse closing edges
        if a != b and not would_cycle(edges=edges, task=a, blockers={b}):
            edges.setdefault(a, set()).add(b)
    assert _acyclic(edges)
    after = {k: set(v) for k, v in edges.items()}
    after.setdefault(task, set()).update(blockers)
    assert would_cycle(edges=edges, task=task, blockers=blockers) is (not _acyclic(after))


def _board_size(team_id):
    from teams.models import Task

    return Task.objects.filter(team_id=team_id).count()


def test_one_members_token_cannot_fill_the_board_and_an_operator_is_never_shut_out(
    api, crew, operator_token, settings
):
    """Given a board of at most 4 open tasks from sessions, 2 of them from any one session,
    when alice creates tasks without end, then her third is refused (409, nothing written), bob
    and the lead still get room until the board is full, and an operator still adds tasks;
    finishing a task gives its creator room again."""
    settings.SWITCHBOARD_OPEN_TASKS_PER_TEAM = 4
    settings.SWITCHBOARD_OPEN_TASKS_PER_SESSION = 2
    mine = [_task(api, crew, f"alice {i}", token=crew.alice.token) for i in range(2)]
    before = _board_size(crew.team_id)
    refused = api.post(crew.path("/tasks"), crew.alice.token, {"title": "alice 2"})
    assert refused.status_code == 409, refused.json_body
    assert refused.json_body["error"] == "conflict"
    assert refused.json_body["reason"] == "board_share_full"
    assert "2" in refused.json_body["detail"]
    assert _board_size(crew.team_id) == before
    _task(api, crew, "bob 0", token=crew.bob.token)
    _task(api, crew, "lead 0")
    full = api.post(crew.path("/tasks"), crew.lead.token, {"title": "lead 1"})
    assert full.status_code == 409, full.json_body
    assert full.json_body["reason"] == "board_full"
    assert _board_size(crew.team_id) == before + 2
    assert api.post(crew.path("/tasks"), operator_token, {"title": "the operator's"}).status_code == 201
    api.post(f"tasks/{mine[0]['id']}/claim", crew.alice.token, {})
    assert api.post(f"tasks/{mine[0]['id']}/complete", crew.alice.token, {}).status_code == 200
    assert api.post(crew.path("/tasks"), crew.alice.token, {"title": "alice again"}).status_code == 201


def test_a_lead_gets_no_fresh_task_bound_by_ending_its_team_and_starting_another(api, crew, settings):
    """Given a lead whose share of open tasks is 2, when it fills its share, ends the team and
    creates another, then the new board refuses its next task: its open tasks count wherever they are."""
    settings.SWITCHBOARD_OPEN_TASKS_PER_SESSION = 2
    for i in range(2):
        _task(api, crew, f"lead {i}")
    assert api.post(f"{crew.path()}/end", crew.lead.token).status_code == 200
    again = api.post("teams", crew.lead.token, {"name": "build-2"})
    assert again.status_code == 201, again.json_body
    refused = api.post(f"teams/{again.json_body['id']}/tasks", crew.lead.token, {"title": "one more"})
    assert refused.status_code == 409, refused.json_body
    assert refused.json_body["reason"] == "board_share_full"
