"""What one session's token reaches of what is not its own: each test reproduces an attack by a
session that holds its own token only, through the hub's real surface."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import time_machine
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from hub_fixtures.sensitivity_corpus import AWS_SECRET
from messaging.models import AgentSession, Delivery

pytestmark = pytest.mark.django_db


def _upload(api: Any, token: str, data: bytes, name: str = "notes.txt") -> str:
    response = api.client.post(
        "/api/v1/files", {"file": SimpleUploadedFile(name, data)}, HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 201, response.content
    return str(response.json()["sha256"])


def test_a_file_the_sender_does_not_hold_is_never_scanned_for_its_send(api, register, settings, tmp_path):
    """The attack: eve knows the shape of a file alice uploaded (a `.env` with one secret in it)
    and hashes candidate contents. She names each SHA-256 in a send to a stopped session whose
    stopped-hold cap is full. Were the file scanned although eve does not hold it, the candidate
    the hub stores would make her send sensitive, held for an operator rather than for the
    stopped session (so past its cap: 404 when attaching), while any other hash hits the cap
    (429): an answer that tells which content the hub stores, i.e. alice's secret. A file the
    sender does not hold must leave the send's answer exactly as an unknown one does."""
    settings.SWITCHBOARD_FILES_DIR = tmp_path / "files"
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT = 1
    alice, eve, carol = register("alice"), register("eve"), register("carol")
    stored = _upload(api, alice.token, f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n".encode(), ".env")
    assert api.patch("sessions/me", carol.token, {"status": "stopped"}).status_code == 200
    waiting = api.post("messages", eve.token, {"to": "carol", "message": "are you there?"})
    assert waiting.status_code == 201 and waiting.json_body["status"] == "held"

    def probe(sha256: str, text: str) -> Any:
        return api.post(
            "messages", eve.token, {"to": "carol", "message": text, "files": [{"sha256": sha256}]}
        )

    guessed, unknown = probe(stored, "the file, first try"), probe("0" * 64, "the file, second try")

    assert (guessed.status_code, guessed.json_body["error"]) == (
        unknown.status_code,
        unknown.json_body["error"],
    )
    assert Delivery.objects.filter(recipient_id=carol.id).count() == 1  # only eve's first message waits


def test_an_outsider_learns_nothing_from_a_task_id(api, register):
    """The attack: task ids count up across the hub, so eve, on no team, walks them. Every task
    route must answer a task on a team she does not read exactly as a task that does not exist;
    a different answer tells her which ids exist, i.e. how busy the other teams' boards are."""
    lead, eve = register("lead-one"), register("eve")
    team = api.post("teams", lead.token, {"name": "build"}).json_body["id"]
    task = api.post(f"teams/{team}/tasks", lead.token, {"title": "ship it"}).json_body["id"]
    absent = task + 1000

    for method, suffix, body in [
        ("GET", "", None),
        ("PATCH", "", {"add_blocked_by": []}),
        ("POST", "/claim", {}),
        ("POST", "/assign", {"member_id": "00000000-0000-0000-0000-000000000000"}),
        ("POST", "/complete", {}),
        ("POST", "/release", None),
    ]:
        there = api.call(method, f"tasks/{task}{suffix}", eve.token, body)
        nowhere = api.call(method, f"tasks/{absent}{suffix}", eve.token, body)
        assert there.status_code == nowhere.status_code == 404, (method, suffix, there.json_body)
        assert there.json_body == nowhere.json_body, (method, suffix)


def test_a_watcher_grant_of_another_session_answers_as_one_that_does_not_exist(api, register):
    """The attack: watcher grant ids count up, so eve walks DELETE /teams/watchers/{id}. She may
    withdraw only her own grants; another session's must stay, and answer exactly as an id no
    grant has, or the walk tells her who let whom read their final answers, and when."""
    alice, bob, eve = register("alice"), register("bob"), register("eve")
    grant = api.post("teams/watchers", alice.token, {"watcher": bob.id}).json_body["id"]

    theirs = api.delete(f"teams/watchers/{grant}", eve.token)
    nowhere = api.delete(f"teams/watchers/{grant + 1000}", eve.token)

    assert theirs.status_code == nowhere.status_code == 404
    assert theirs.json_body == nowhere.json_body
    assert [w["id"] for w in api.get("teams/watchers", alice.token).json_body["watchers"]] == [grant]


@pytest.fixture
def fresh_hub_bucket(settings: Any) -> None:
    """A hub-wide bucket of 100 messages per 10 s, in a key space of this test's own."""
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-limits-{uuid.uuid4().hex}"
    settings.SWITCHBOARD_RATE_HUB, settings.SWITCHBOARD_RATE_HUB_SECONDS = 100, 10


def test_sends_the_pair_bucket_refuses_do_not_use_up_the_hubs_bucket(api, register, fresh_hub_bucket):
    """The attack, with one session token (mallory's): a batch of 100 messages to one recipient.
    The pair's bucket lets 10 through; the other 90 were refused, yet each had taken a token of the
    hub-wide bucket first, so one request emptied it and every other session of the hub was
    refused (`hub_rate`) for its whole period, again at each repeat."""
    mallory, victim, alice, bob = register("mallory"), register("victim"), register("alice"), register("bob")
    with time_machine.travel(timezone.now(), tick=False):
        batch = [{"to": victim.id, "message": f"m{i}"} for i in range(100)]
        sent = api.post("messages/batch", mallory.token, {"messages": batch}).json_body
        assert (sent["accepted"], sent["failed"]) == (10, 90)
        assert {r["error"] for r in sent["results"][10:]} == {"rate_limited"}
        others = api.post("messages", alice.token, {"to": bob.id, "message": "the build is green"})
        assert others.status_code == 201, others.json_body


def test_a_batch_under_way_holds_no_more_of_the_hubs_bucket_than_its_pairs_allow(register, fresh_hub_bucket):
    """While a batch to one recipient runs, it holds the hub tokens it reserved: no more than that
    pair's bucket can let through, so others still send meanwhile."""
    from messaging.services.limits import limits_reserve

    mallory, victim, alice, bob = (
        AgentSession.objects.get(pk=register(name).id) for name in ("mallory", "victim", "alice", "bob")
    )
    with time_machine.travel(timezone.now(), tick=False):
        held = limits_reserve(sender=mallory, recipient_ids=[victim.id] * 1000)
        try:
            limits_reserve(sender=alice, recipient_ids=[bob.id]).spend(bob)  # raises when the hub is empty
        finally:
            held.release()


def test_one_sender_cannot_take_all_of_a_stopped_sessions_room_for_held_messages(
    api, register, send, settings
):
    """The attack: eve sends a stopped session as many messages as may be held for it (about a
    minute at the pair rate), so that every other sender's message to it is refused (429
    `hold_full`) until it starts again, up to a day later. A sender's share of that room is
    bounded, as its share of an inbox is."""
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT = 4
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER = 2
    alice, eve, carol = register("alice"), register("eve"), register("carol")
    assert api.patch("sessions/me", carol.token, {"status": "stopped"}).status_code == 200
    answers = [send(eve, "carol", f"filler {n}") for n in range(4)]
    assert [a.json_body.get("status") for a in answers[:2]] == ["held", "held"]
    assert {(a.status_code, a.json_body.get("error")) for a in answers[2:]} == {(429, "hold_full")}
    assert "yours" in answers[2].json_body["detail"]

    sent = send(alice, "carol", "the build is green")

    assert sent.status_code == 201 and sent.json_body["status"] == "held", sent.json_body


def test_one_sender_cannot_fill_the_hubs_room_for_messages_to_stopped_sessions(api, register, send, settings):
    """The attack: eve sends her share to each of many stopped sessions, until the hub holds as
    many messages for stopped sessions as it may; then nobody's message to any stopped session is
    held. One sender's share of the hub's room is bounded too, so alice's message to a stopped
    session is still held for it."""
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT = 4
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER = 2
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_HUB = 8
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_SENDER_ON_HUB = 4
    alice, eve = register("alice"), register("eve")
    stopped = [register(f"sleeper-{n}", status="stopped") for n in range(4)]
    answers = [send(eve, s.name, f"filler {n}") for s in stopped for n in range(2)]
    assert [a.json_body.get("status") for a in answers[:4]] == ["held"] * 4
    refused = answers[4:]
    assert {(a.status_code, a.json_body.get("error")) for a in refused} == {(429, "hold_full")}
    assert "yours" in refused[0].json_body["detail"] and "4" in refused[0].json_body["detail"]
    assert Delivery.objects.filter(message__sender_id=eve.id, state="held").count() == 4

    sent = send(alice, stopped[3].name, "the build is green")

    assert sent.status_code == 201 and sent.json_body["status"] == "held", sent.json_body


def test_a_full_room_for_held_messages_does_not_tell_a_sender_how_many_others_wait(
    api, register, send, settings
):
    """The attack: eve sends to a session whose room for held messages is full and reads, in the
    refusal, how many messages other senders have waiting for it (for an operator, or until it
    starts again): that is the recipient's traffic, not hers. The refusal names the limit only."""
    alice, eve = register("alice"), register("eve")
    carol, dave = register("carol"), register("dave", status="stopped")
    assert api.call("PUT", "sessions/me/policy", carol.token, {"policy": "hold"}).status_code == 200
    for n in range(7):
        assert send(alice, "carol", f"for review {n}").json_body["status"] == "held"
        assert send(alice, "dave", f"for later {n}").json_body["status"] == "held"
    settings.SWITCHBOARD_HOLDS_PER_RECIPIENT = 3
    settings.SWITCHBOARD_STOPPED_HOLDS_PER_RECIPIENT = 3

    for to in ("carol", "dave"):
        refused = send(eve, to, "hello")
        assert (refused.status_code, refused.json_body["error"]) == (429, "hold_full"), refused.json_body
        detail = refused.json_body["detail"].replace(carol.ref, "").replace(dave.ref, "")
        assert "7" not in detail and "3" in detail, detail


def test_discovery_does_not_tell_a_session_how_other_sessions_run(api, register):
    """The attack: eve, looking for a victim for a prompt injection, lists the agents and picks
    those whose permission mode is `bypass` (they run tools without asking) and whose inbound
    policy lets a stranger's message straight through. How another session runs is its own (and
    its operators'); discovery shows it to that session only, as it does its socket inbox."""
    alice, eve = register("alice", permission_mode="bypass"), register("eve")
    assert api.call("PUT", "sessions/me/policy", alice.token, {"policy": "accept"}).status_code == 200

    listed = {a["name"]: a for a in api.get("agents", eve.token).json_body["agents"]}
    own = {a["name"]: a for a in api.get("agents", alice.token).json_body["agents"]}

    assert listed["alice"]["permission_mode"] is None and listed["alice"]["inbound_policy"] is None
    assert listed["eve"]["permission_mode"] == "default"
    assert own["alice"]["permission_mode"] == "bypass" and own["alice"]["inbound_policy"] == "accept"
