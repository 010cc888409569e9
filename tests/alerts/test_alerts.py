"""Operator alerts end to end inside one process: what is detected, that each thing is posted once
per kind to a real HTTP listener on 127.0.0.1, what acknowledging stops, how failures are retried
and audited, and that no alert carries a message's text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from alerts.models import Alert, AlertState
from alerts.services import alert_acknowledge, alerts_detect, alerts_run
from hub_fixtures.sensitivity_corpus import AWS_SECRET
from messaging.errors import Forbidden
from messaging.hold_reasons import hold_reason_label
from messaging.models import AgentSession, AuditEvent, Delivery
from messaging.principals import HUB, operator_principal
from tests.teams.hooks import Hook

SECRET_TEXT = f"creds for the deploy: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} (rotate after)"
OPERATOR = operator_principal("ada")


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A webhook receiver: a real HTTP server on a free 127.0.0.1 port."""
    server = Hook().start()
    yield server
    server.stop()


@pytest.fixture
def sent(api: Any) -> Any:
    """Send through the API (jobs started after a commit do not run: the test's transaction never
    commits; tests run `alerts_run` themselves, as the periodic job would)."""

    def _sent(sender: Any, to: str, text: str, **fields: Any) -> Any:
        return api.post("messages", sender.token, {"to": to, "message": text, **fields})

    return _sent


@pytest.fixture
def alerting(settings: Any, hook: Hook) -> Hook:
    """Given the hub posts alerts (Slack shape) to `hook`, loopback allowed as an operator would."""
    settings.SWITCHBOARD_ALERT_WEBHOOK_URL = hook.url
    settings.SWITCHBOARD_ALERT_FORMAT = "slack"
    settings.SWITCHBOARD_OUTBOUND_ALLOW = ["127.0.0.1"]
    settings.SWITCHBOARD_ALERT_CONSOLE_URL = "https://hub.example"
    return hook


def _escalated(register: Any, send: Any, tag: str = "") -> tuple[Any, Any, int]:
    alice, bob = register(f"alice{tag}"), register(f"bob{tag}")
    r = send(alice, bob.id, SECRET_TEXT, summary="deploy creds")
    assert r.json_body["status"] == "held" and r.json_body["tier"] == "sensitive"
    return alice, bob, Delivery.objects.get(message_id=r.json_body["id"]).pk


def _routine(register: Any, send: Any, api: Any, operator_token: str) -> int:
    carol, dave = register("carol"), register("dave")
    assert (
        api.call("PUT", f"sessions/{dave.id}/policy", operator_token, {"policy": "hold"}).status_code == 200
    )
    r = send(carol, dave.id, "please merge PR 7")
    assert r.json_body["status"] == "held"
    return Delivery.objects.get(message_id=r.json_body["id"]).pk


def test_a_send_that_makes_an_escalated_hold_starts_the_alerts_job(
    alerting, register, api, operator_token, monkeypatch, django_capture_on_commit_callbacks
):
    """Not at the next tick: the send's commit starts the job (in the background), through
    messaging's escalated_holds_created. A routine hold starts nothing."""
    started: list[str] = []
    monkeypatch.setattr("messaging.jobs._submit", lambda name, args: started.append(name))
    alice, bob = register("alice"), register("bob")
    with django_capture_on_commit_callbacks(execute=True):
        api.post("messages", alice.token, {"to": bob.id, "message": "please merge PR 7"})
    assert started == []
    assert api.call("PUT", f"sessions/{bob.id}/policy", operator_token, {"policy": "hold"}).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        assert (
            api.post("messages", alice.token, {"to": bob.id, "message": "again"}).json_body["status"]
            == "held"
        )
    assert started == []
    with django_capture_on_commit_callbacks(execute=True):
        api.post("messages", alice.token, {"to": bob.id, "message": SECRET_TEXT})
    assert started == ["alerts.tasks.alerts_run"]


def test_a_new_escalated_hold_is_posted_once(alerting, register, sent):
    alice, bob, hold = _escalated(register, sent)
    alerts_run()
    [posted] = alerting.received
    text = posted["text"]
    assert text.startswith("*Switchboard: An escalated hold needs an operator*")
    assert f"hold {hold}: alice [{alice.ref}] → bob [{bob.ref}], sensitive: AWS secret access key" in text
    assert f"<https://hub.example/alerts/holds/{hold}/|acknowledge>" in text
    assert AWS_SECRET not in json.dumps(posted) and "deploy creds" not in text
    alerts_run()
    alerts_run()
    assert len(alerting.received) == 1
    assert Alert.objects.get(delivery_id=hold).state == AlertState.SENT
    [audit] = AuditEvent.objects.filter(kind="alert.sent")
    assert audit.target == "escalated_hold" and audit.detail["ids"] == [str(hold)]
    assert alerting.url not in json.dumps(audit.detail)


def test_a_routine_hold_is_not_an_escalated_alert(alerting, register, sent, api, operator_token):
    _routine(register, sent, api, operator_token)
    alerts_run()
    assert alerting.received == []


def test_a_hold_about_to_expire_is_posted_once_within_the_lead_time(
    alerting, settings, register, sent, api, operator_token
):
    hold = _routine(register, sent, api, operator_token)
    settings.SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS = 60
    alerts_run()
    assert alerting.received == []  # five minutes left: not yet
    Delivery.objects.filter(pk=hold).update(expires_at=timezone.now() + timedelta(seconds=30))
    alerts_run()
    alerts_run()
    [posted] = alerting.received
    assert posted["text"].startswith("*Switchboard: A hold expires within 60 s*")
    assert (
        f"hold {hold}: carol [" in posted["text"] and hold_reason_label("operator_policy") in posted["text"]
    )


def test_an_escalated_hold_about_to_expire_gets_both_alerts(alerting, register, sent):
    _alice, _bob, hold = _escalated(register, sent)
    Delivery.objects.filter(pk=hold).update(expires_at=timezone.now() + timedelta(seconds=30))
    alerts_run()
    assert [p["text"].splitlines()[0] for p in alerting.received] == [
        "*Switchboard: An escalated hold needs an operator*",
        "*Switchboard: A hold expires within 60 s*",
    ]


def test_a_session_gone_silent_is_posted_once_per_silence(alerting, settings, register):
    worker = register("worker")
    silent_since = timezone.now() - timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 60)
    AgentSession.objects.filter(pk=worker.id).update(last_seen=silent_since)
    alerts_run()
    alerts_run()
    [posted] = alerting.received
    assert posted["text"].startswith("*Switchboard: An agent went silent*")
    assert f"worker [{worker.ref}] (script): idle but silent for 11 min" in posted["text"]
    assert f"<https://hub.example/alerts/sessions/{worker.id}/|acknowledge>" in posted["text"]
    # Heard from again, then silent again: a new silence, a new alert.
    AgentSession.objects.filter(pk=worker.id).update(last_seen=silent_since + timedelta(seconds=30))
    alerts_run()
    assert len(alerting.received) == 2


def test_a_live_session_and_an_exited_one_are_not_dead(alerting, settings, register, api):
    live, gone = register("live"), register("gone")
    api.delete("sessions/me", gone.token)
    long_ago = timezone.now() - timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 60)
    AgentSession.objects.filter(pk=gone.id).update(last_seen=long_ago)
    assert AgentSession.objects.get(pk=gone.id).status == "exited"
    alerts_run()
    assert alerting.received == [] and live


def test_acknowledging_a_hold_stops_its_later_alerts_and_is_audited(alerting, register, sent):
    _alice, _bob, hold = _escalated(register, sent)
    alerts_run()
    assert len(alerting.received) == 1
    alert_acknowledge(actor=OPERATOR, delivery_id=hold)
    Delivery.objects.filter(pk=hold).update(expires_at=timezone.now() + timedelta(seconds=30))
    alerts_run()
    assert len(alerting.received) == 1  # no "about to expire" for an acknowledged hold
    [event] = AuditEvent.objects.filter(kind="alert.acknowledged")
    assert (event.actor, event.target, event.delivery_id) == ("operator:ada", f"hold:{hold}", hold)


def test_an_alert_acknowledged_before_it_was_posted_is_dropped(alerting, settings, register):
    worker = register("worker")
    long_ago = timezone.now() - timedelta(seconds=settings.SWITCHBOARD_DEAD_AFTER_SECONDS + 60)
    AgentSession.objects.filter(pk=worker.id).update(last_seen=long_ago)
    assert alerts_detect(now=timezone.now()) == 1
    alert_acknowledge(actor=OPERATOR, session_id=worker.id)
    alerts_run()
    assert alerting.received == []
    assert Alert.objects.get(session_id=worker.id).state == AlertState.SKIPPED


def test_an_alert_written_after_its_acknowledgement_is_dropped_when_due(alerting, register, sent):
    """The race acknowledging cannot close by itself: a detection that read before the operator
    acknowledged writes its row after. The post checks again and says nothing."""
    _alice, _bob, hold = _escalated(register, sent)
    alert_acknowledge(actor=OPERATOR, delivery_id=hold)
    Alert.objects.create(kind="escalated_hold", delivery_id=hold)  # the late detection's row
    alerts_run()
    assert alerting.received == []
    assert Alert.objects.get(delivery_id=hold, kind="escalated_hold").state == AlertState.SKIPPED


def test_only_an_operator_acknowledges(db, register):
    worker = register("worker")
    with pytest.raises(Forbidden):
        alert_acknowledge(actor=HUB, session_id=worker.id)


def test_detection_twice_at_once_makes_one_alert_per_thing(alerting, settings, register, sent):
    _alice, _bob, hold = _escalated(register, sent)
    now = timezone.now()
    assert alerts_detect(now=now) == 1
    # A second runner that read before the first wrote inserts the same row: ignored.
    Alert.objects.bulk_create([Alert(kind="escalated_hold", delivery_id=hold)], ignore_conflicts=True)
    assert alerts_detect(now=now) == 0
    assert Alert.objects.filter(delivery_id=hold).count() == 1


def test_a_failed_post_is_retried_with_backoff_then_given_up(alerting, settings, register, sent):
    settings.SWITCHBOARD_ALERT_ATTEMPTS = 2
    alerting.answer(503)
    alerting.answer(500)
    _alice, _bob, hold = _escalated(register, sent)
    alerts_run()
    alert = Alert.objects.get(delivery_id=hold)
    assert (alert.state, alert.attempts, alert.last_error) == ("pending", 1, "HTTP 503")
    alerts_run()  # not due yet: the backoff holds it back
    assert len(alerting.received) == 1
    alerts_run(now=alert.next_attempt_at + timedelta(seconds=1))
    assert len(alerting.received) == 2
    alert.refresh_from_db()
    assert (alert.state, alert.attempts, alert.last_error) == ("failed", 2, "HTTP 500")
    failures = AuditEvent.objects.filter(kind="alert.failed").order_by("id")
    assert [e.detail["retry"] for e in failures] == [True, False]


def test_a_url_the_hub_may_not_call_fails_without_a_connection(alerting, settings, register, sent):
    settings.SWITCHBOARD_OUTBOUND_ALLOW = []  # loopback is refused unless an operator allows it
    _alice, _bob, hold = _escalated(register, sent)
    alerts_run()
    assert alerting.received == []
    alert = Alert.objects.get(delivery_id=hold)
    assert (alert.state, alert.last_error) == ("failed", "refused: forbidden")


def test_a_hold_decided_before_its_alert_went_out_is_not_posted(alerting, settings, register, sent):
    _alice, _bob, hold = _escalated(register, sent)
    alerts_detect(now=timezone.now())
    Delivery.objects.filter(pk=hold).update(state="denied")
    alerts_run()
    assert alerting.received == []
    assert Alert.objects.get(delivery_id=hold).state == AlertState.SKIPPED


def test_ntfy_alerts_go_to_the_server_root(alerting, settings, register, sent):
    settings.SWITCHBOARD_ALERT_FORMAT = "ntfy"
    settings.SWITCHBOARD_ALERT_WEBHOOK_URL = alerting.url.rsplit("/", 1)[0] + "/sb-alerts"
    _escalated(register, sent)
    alerts_run()
    assert alerting.paths == ["/"]
    [posted] = alerting.received
    assert posted["topic"] == "sb-alerts" and posted["priority"] == 4


def test_without_a_webhook_nothing_is_detected(settings, register, sent):
    settings.SWITCHBOARD_ALERT_WEBHOOK_URL = ""
    _escalated(register, sent)
    assert alerts_run() == {"detected": 0, "posted": 0}
    assert not Alert.objects.exists()


def test_a_post_the_receiver_refuses_is_not_retried(alerting, register, sent):
    alerting.answer(404)
    _alice, _bob, hold = _escalated(register, sent)
    alerts_run()
    alert = Alert.objects.get(delivery_id=hold)
    assert (alert.state, alert.attempts, alert.last_error) == ("failed", 1, "HTTP 404")
    [failure] = AuditEvent.objects.filter(kind="alert.failed")
    assert failure.detail["retry"] is False


def test_the_periodic_job_runs_only_on_a_hub_that_posts_alerts(settings):
    from alerts.apps import alerts_jobs
    from hub.celery import app

    settings.SWITCHBOARD_ALERT_WEBHOOK_URL = ""
    assert alerts_jobs() == []
    settings.SWITCHBOARD_ALERT_WEBHOOK_URL = "https://hooks.example/x"
    settings.SWITCHBOARD_ALERT_SECONDS = 2
    [job] = alerts_jobs()
    assert (job.task_name, job.every_seconds) == ("alerts.tasks.alerts_run", 2)
    app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    assert job.task_name in app.tasks


def test_an_ntfy_url_without_a_topic_fails_the_alert_and_not_the_job(alerting, settings, register, sent):
    settings.SWITCHBOARD_ALERT_FORMAT = "ntfy"
    settings.SWITCHBOARD_ALERT_WEBHOOK_URL = alerting.url.rsplit("/", 1)[0] + "/"
    _alice, _bob, hold = _escalated(register, sent)
    assert alerts_run()["posted"] == 0
    alert = Alert.objects.get(delivery_id=hold)
    assert (alert.state, alert.last_error) == ("failed", "refused: invalid")
    assert alerting.received == []
