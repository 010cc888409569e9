"""Observers: one-way reports to their one target, marked as such; no ordinary send or receive."""

from __future__ import annotations

from messaging.models import Delivery


def _observe(api, who, **target):
    made = api.post("teams/observers", who.token, target)
    assert made.status_code == 201, made.json_body
    return made.json_body


def test_an_observer_reports_to_its_target_marked_as_an_observer_report(api, register):
    watcher, worker = register("watcher"), register("worker")
    _observe(api, watcher, target_session=worker.id)
    sent = api.post(
        "teams/observers/report", watcher.token, {"message": "tests look slow", "summary": "perf"}
    )
    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["to"]["id"] == worker.id
    [report] = api.get("inbox", worker.token).json_body["messages"]
    assert report["kind"] == "observer_report"
    assert "KIND=observer_report" in report["marker"] and "TRUST=observer-report" in report["marker"]
    assert report["trust"] == "observer-report"
    assert "grants no authority" in report["framed"]


def test_an_observer_cannot_send_ordinary_messages(api, register, send):
    watcher, worker = register("watcher"), register("worker")
    register("other")
    _observe(api, watcher, target_session=worker.id)
    for target in ("worker", "other"):
        refused = send(watcher, target, "hello")
        assert refused.status_code == 403 and refused.json_body["reason"] == "observer"
    assert not Delivery.objects.filter(message__sender_id=watcher.id, message__kind="text").exists()


def test_nobody_can_message_an_observer(api, register, send):
    watcher, worker = register("watcher"), register("worker")
    _observe(api, watcher, target_session=worker.id)
    refused = send(worker, "watcher", "what do you see?")
    assert refused.status_code == 403 and refused.json_body["reason"] == "observer"
    assert api.get("inbox", watcher.token).json_body["messages"] == []


def test_only_observers_send_reports(api, register):
    plain = register("plain")
    refused = api.post("teams/observers/report", plain.token, {"message": "psst"})
    assert refused.status_code == 403 and refused.json_body["reason"] == "not_observer"


def test_a_team_observer_reports_to_the_lead(api, crew, register):
    watcher = register("watcher")
    _observe(api, watcher, target_team=crew.team_id)
    sent = api.post("teams/observers/report", watcher.token, {"message": "bob is looping"})
    assert sent.json_body["to"]["id"] == crew.lead.id
    # The lead's invitation opens (it is not the lead's to learn who observes); the observer's
    # accept is refused.
    invited = api.post(crew.path("/members"), crew.lead.token, {"session": watcher.id})
    assert invited.status_code == 202, invited.json_body
    joined = api.post(f"teams/invitations/{invited.json_body['invitation']['id']}/accept", watcher.token)
    assert joined.status_code == 409 and joined.json_body["reason"] == "observer"


def test_a_member_cannot_become_an_observer_and_only_operators_lift_it(
    api, crew, register, operator_token, send
):
    refused = api.post("teams/observers", crew.alice.token, {"target_session": crew.bob.id})
    assert refused.status_code == 409
    watcher = register("watcher")
    _observe(api, watcher, target_session=crew.bob.id)
    assert api.delete(f"teams/observers/{watcher.id}", watcher.token).status_code == 403
    assert api.delete(f"teams/observers/{watcher.id}", operator_token).status_code == 200
    assert send(watcher, "bob", "free again").status_code == 201


def test_a_session_registers_only_itself_unless_operator(api, register, operator_token):
    a, b = register("aaa"), register("bbb")
    assert api.post("teams/observers", a.token, {"session": b.id, "target_session": a.id}).status_code == 403
    made = api.post("teams/observers", operator_token, {"session": b.id, "target_session": a.id})
    assert made.status_code == 201 and made.json_body["session"] == b.id


def test_an_observer_cannot_subscribe_to_idle_notifications(api, register):
    watcher, worker = register("watcher"), register("worker")
    _observe(api, watcher, target_session=worker.id)
    refused = api.post("teams/subscriptions", watcher.token, {"target": worker.id})
    assert refused.status_code == 403 and refused.json_body["reason"] == "observer"
