"""The pages an alert links to: operators only, the hold or session in words (never the text),
and an "Acknowledge" button that is a CSRF-checked, audited POST."""

from __future__ import annotations

from django.test import Client

from alerts.models import Acknowledgement
from hub_fixtures.sensitivity_corpus import AWS_SECRET
from messaging.models import AuditEvent, Delivery
from tests.console.conftest import csrf_post

SECRET_TEXT = f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}"


def _hold(register, send) -> int:
    alice, bob = register("alice"), register("bob")
    r = send(alice, bob.id, SECRET_TEXT, summary="the key")
    assert r.json_body["status"] == "held"
    return Delivery.objects.get(message_id=r.json_body["id"]).pk


def test_the_hold_page_is_for_operators_and_says_why_without_the_text(
    operator_client, visitor_client, register, send
):
    hold = _hold(register, send)
    url = f"/alerts/holds/{hold}/"
    assert Client().get(url).status_code == 302
    assert visitor_client.get(url).status_code == 302
    page = operator_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "sensitive: AWS secret access key" in html and "held (escalated)" in html
    assert AWS_SECRET not in html and "the key" not in html
    assert "data-acknowledge" in html and "Content-Security-Policy" in page.headers
    # The same chrome as every console page: the strip of what needs a human, counted.
    assert 'data-attention="escalated" data-count="1"' in html


def test_acknowledging_a_hold_takes_a_csrf_token_and_is_audited(operator_client, register, send):
    hold = _hold(register, send)
    url = f"/alerts/holds/{hold}/acknowledge"
    assert operator_client.post(url).status_code == 403  # no CSRF token: refused
    assert not Acknowledgement.objects.exists()
    r = csrf_post(operator_client, url, {})
    assert r.status_code == 302 and r["Location"] == f"/alerts/holds/{hold}/"
    [ack] = Acknowledgement.objects.all()
    assert (ack.delivery_id, ack.by) == (hold, "operator:op")
    assert AuditEvent.objects.filter(kind="alert.acknowledged", target=f"hold:{hold}").count() == 1
    page = operator_client.get(f"/alerts/holds/{hold}/").content.decode()
    assert "acknowledged: no more alerts about it" in page and "by operator:op" in page


def test_a_visitor_cannot_acknowledge(visitor_client, register, send):
    hold = _hold(register, send)
    r = csrf_post(visitor_client, f"/alerts/holds/{hold}/acknowledge", {})
    assert r.status_code == 302 and r["Location"].startswith("/login/")
    assert not Acknowledgement.objects.exists()


def test_the_session_page_acknowledges_its_silence(operator_client, register):
    worker = register("worker")
    page = operator_client.get(f"/alerts/sessions/{worker.id}/")
    assert page.status_code == 200 and f"worker [{worker.ref}]" in page.content.decode()
    r = csrf_post(operator_client, f"/alerts/sessions/{worker.id}/acknowledge", {})
    assert r.status_code == 302
    assert Acknowledgement.objects.get().session_id is not None


def test_unknown_holds_and_sessions_are_404(operator_client):
    assert operator_client.get("/alerts/holds/999999/").status_code == 404
    assert operator_client.get("/alerts/sessions/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert csrf_post(operator_client, "/alerts/holds/999999/acknowledge", {}).status_code == 404
