"""Idle and liveness: the lead gets the final answer; dead is not idle; notify-when-idle."""

from __future__ import annotations

from datetime import timedelta

import time_machine
from django.utils import timezone

from messaging.models import Message
from teams.models import Subscription
from teams.services.subscriptions import subscriptions_lapse_due
from tests.teams.conftest import frames_in


def _status(api, agent, status, final_answer=None):
    body = {"status": status} if final_answer is None else {"status": status, "final_answer": final_answer}
    response = api.patch("sessions/me", agent.token, body)
    assert response.status_code == 200, response.json_body
    return response.json_body


def test_a_teammate_going_idle_sends_its_final_answer_to_the_lead(api, crew):
    _status(api, crew.alice, "busy")
    _status(api, crew.alice, "idle", final_answer="Fixed the flaky test: it raced the clock.")
    [note] = frames_in(api, crew.lead, "idle_notification")
    assert note["frame"]["final_answer"] == "Fixed the flaky test: it raced the clock."
    assert note["frame"]["from_member"] == crew.members["alice"]
    assert note["from"]["id"] == crew.alice.id
    assert "alice is idle" in note["summary"]


def test_each_turn_end_is_reported_and_a_lead_going_idle_reports_nothing(api, crew):
    answers = []
    for answer in ("first", "second"):
        _status(api, crew.alice, "busy")
        _status(api, crew.alice, "idle", final_answer=answer)
        # The lead reads each; an unread one would be replaced by the next (tests/security).
        answers += [m["frame"]["final_answer"] for m in frames_in(api, crew.lead, "idle_notification")]
    assert answers == ["first", "second"]
    _status(api, crew.lead, "busy")
    _status(api, crew.lead, "idle", final_answer="lead's own")
    assert frames_in(api, crew.alice) == []


def test_the_idle_notification_is_kept_for_a_stopped_lead_and_arrives_when_it_returns(api, crew):
    _status(api, crew.lead, "stopped")
    _status(api, crew.alice, "busy")
    _status(api, crew.alice, "idle", final_answer="done while you were away")
    assert Message.objects.filter(frame_type="idle_notification").count() == 1
    _status(api, crew.lead, "idle")
    [note] = frames_in(api, crew.lead, "idle_notification")
    assert note["frame"]["final_answer"] == "done while you were away"


def test_the_idle_notification_is_not_lost_to_rate_limits(api, crew, settings, send):
    settings.SWITCHBOARD_UNREAD_PER_RECIPIENT = 2
    assert send(crew.bob, "lead", "one").status_code == 201
    assert send(crew.bob, "lead", "two").status_code == 201
    assert send(crew.bob, "lead", "three").status_code == 429
    _status(api, crew.alice, "busy")
    _status(api, crew.alice, "idle", final_answer="still reaches the lead")
    assert [m["frame"]["final_answer"] for m in frames_in(api, crew.lead, "idle_notification")] == [
        "still reaches the lead"
    ]


def test_dead_is_a_silent_running_session_not_an_idle_one(api, crew, settings):
    roster = {m["name"]: m["session"] for m in api.get(crew.path(), crew.lead.token).json_body["members"]}
    assert roster["alice"]["liveness"] == "idle" and roster["alice"]["dead"] is False
    _status(api, crew.bob, "stopped")
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 5)
    with time_machine.travel(later, tick=False):
        _status(api, crew.alice, "busy")  # alice is heard from; the others are not
        roster = {m["name"]: m["session"] for m in api.get(crew.path(), crew.lead.token).json_body["members"]}
        listed = {a["name"]: a for a in api.get("agents", crew.lead.token).json_body["agents"]}
    assert roster["alice"]["liveness"] == "busy" and roster["alice"]["dead"] is False
    assert roster["bob"]["liveness"] == "stopped" and roster["bob"]["dead"] is False
    assert roster["lead-one"]["dead"] is False  # its own call was a heartbeat
    assert listed["bob"]["dead"] is False and listed["alice"]["dead"] is False


def test_a_session_without_heartbeats_turns_dead(api, register, settings):
    watcher = register("watcher")
    register("quiet")
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 5)
    with time_machine.travel(later, tick=False):
        listed = {a["name"]: a for a in api.get("agents", watcher.token).json_body["agents"]}
    assert listed["quiet"]["status"] == "idle"
    assert listed["quiet"]["dead"] is True and listed["quiet"]["liveness"] == "dead"
    assert listed["watcher"]["dead"] is False


def _subscribe(api, who, target):
    made = api.post("teams/subscriptions", who.token, {"target": target.id})
    assert made.status_code == 201, made.json_body
    return made.json_body


def test_notify_when_idle_fires_at_once_when_the_target_is_idle(api, register):
    me, worker = register("me"), register("worker")
    sub = _subscribe(api, me, worker)
    assert sub["state"] == "fired" and sub["fired_on"] == "idle"
    [note] = api.get("inbox", me.token).json_body["messages"]
    assert note["kind"] == "notification" and "worker" in note["text"] and "idle" in note["text"]


def test_notify_when_idle_fires_once_at_the_next_idle_and_does_not_wake_the_target(api, register):
    me, worker = register("me"), register("worker")
    _status(api, worker, "busy")
    sub = _subscribe(api, me, worker)
    assert sub["state"] == "waiting"
    assert api.get("inbox", worker.token).json_body["messages"] == []  # nothing sent to the target
    assert _subscribe(api, me, worker)["id"] == sub["id"]  # subscribing again is the same one
    # `me` is not on worker's team, so worker allows it to read its final answers.
    assert api.post("teams/watchers", worker.token, {"watcher": me.id}).status_code == 201
    _status(api, worker, "idle", final_answer="all green")
    [note] = api.get("inbox", me.token).json_body["messages"]
    assert "all green" in note["text"]
    _status(api, worker, "busy")
    _status(api, worker, "idle", final_answer="again")
    assert api.get("inbox", me.token).json_body["messages"] == []  # fired once only
    assert Subscription.objects.get(pk=sub["id"]).state == "fired"


def test_the_watched_session_learns_nothing_of_who_watches_it(
    api, register, operator_token, monkeypatch, django_capture_on_commit_callbacks
):
    """The attack: worker wants to know who watches it. The notice that tells a subscriber it is
    idle is written in worker's name, so were worker told of it as of a message it sent (the live
    `message.sent` event naming the recipient, receipts as it is pulled and read, its status at
    GET /messages/{id}, the hub's word on a hold's outcome), its token would learn each watcher and
    when it reads. Worker must hear nothing of it."""
    from messaging.services import events

    me, worker = register("me"), register("worker")
    heard: list[tuple[list[str], dict]] = []
    monkeypatch.setattr(events, "_send_many", heard.extend)
    worker_group = events.session_group(worker.id)
    with django_capture_on_commit_callbacks(execute=True):
        assert _subscribe(api, me, worker)["state"] == "fired"
        [note] = api.get("inbox", me.token).json_body["messages"]
        assert api.post("inbox/ack", me.token, {"ids": [note["id"]]}).status_code == 200
    assert heard, "the notice's events were sent"
    assert [e.get("kind", e["type"]) for groups, e in heard if worker_group in groups] == []
    assert api.get(f"messages/{note['id']}", worker.token).status_code == 404

    # Held for an operator by the subscriber's policy, then denied: worker is not told either.
    assert api.call("PUT", "sessions/me/policy", me.token, {"policy": "hold"}).status_code == 200
    _status(api, worker, "busy")
    _subscribe(api, me, worker)
    _status(api, worker, "idle", final_answer="done")
    [held] = api.get("holds", operator_token).json_body["holds"]
    assert api.post(f"holds/{held['id']}/deny", operator_token, {"reason": "no"}).status_code == 200
    assert api.get("inbox", worker.token).json_body["messages"] == []


def test_notify_when_idle_fires_on_exit(api, register):
    me, worker = register("me"), register("worker")
    _status(api, worker, "busy")
    _subscribe(api, me, worker)
    assert api.delete("sessions/me", worker.token).status_code == 200
    [note] = api.get("inbox", me.token).json_body["messages"]
    assert "exited" in note["text"]


def test_notify_when_idle_lapses_after_twelve_hours(api, register, settings):
    me, worker = register("me"), register("worker")
    _status(api, worker, "busy")
    sub = _subscribe(api, me, worker)
    later = timezone.now() + timedelta(seconds=settings.SWITCHBOARD_IDLE_SUBSCRIPTION_SECONDS + 1)
    with time_machine.travel(later, tick=False):
        _status(api, worker, "idle", final_answer="too late")
        assert api.get("inbox", me.token).json_body["messages"] == []
        assert subscriptions_lapse_due() == 1
    assert Subscription.objects.get(pk=sub["id"]).state == "lapsed"


def test_a_session_cannot_subscribe_to_itself(api, register):
    me = register("me")
    assert api.post("teams/subscriptions", me.token, {"target": me.id}).status_code == 400
