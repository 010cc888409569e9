"""Operator login (issue 30, item 11): password guessing is locked out, weak passwords are refused,
idle console sessions end, and cookies can be made HTTPS-only. Each test reproduces the attack."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
import time_machine
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from messaging.models import AuditEvent

REPO = Path(__file__).resolve().parents[2]
NAME, PASSWORD = "ada", "a-good-operator-passphrase"


@pytest.fixture
def operator(db: None) -> str:
    """An operator `ada` with a sound password."""
    get_user_model().objects.create_user(NAME, password=PASSWORD, is_staff=True)
    return NAME


def _log_in(client: Client, password: str) -> int:
    return client.post("/login/", {"username": NAME, "password": password}).status_code


def _logged_in(client: Client) -> bool:
    return client.get("/").status_code == 200


def _guess(times: int) -> None:
    guesser = Client()
    for i in range(times):
        assert _log_in(guesser, f"wrong-guess-{i}") in (200, 429)


def test_repeated_failures_lock_the_account_even_for_the_right_password(operator):
    """Given an operator, when 30 wrong passwords are tried, then the right one is refused too
    (429, locked), from another browser as well: the count is kept in the database."""
    _guess(30)
    browser = Client()
    assert _log_in(browser, PASSWORD) == 429
    assert not _logged_in(browser)
    page = browser.post("/login/", {"username": NAME, "password": PASSWORD})
    assert b"locked" in page.content and "script-src 'self'" in page["Content-Security-Policy"]


def test_the_lock_counts_from_the_configured_limit(operator):
    _guess(settings.AXES_FAILURE_LIMIT - 1)
    assert _log_in(Client(), PASSWORD) == 302  # one short of the limit: still in, and the count resets
    _guess(settings.AXES_FAILURE_LIMIT)
    assert _log_in(Client(), PASSWORD) == 429


def test_the_lock_lifts_after_the_cool_off(operator):
    _guess(settings.AXES_FAILURE_LIMIT)
    with time_machine.travel(timezone.now() + settings.AXES_COOLOFF_TIME + timedelta(seconds=5), tick=False):
        browser = Client()
        assert _log_in(browser, PASSWORD) == 302
        assert _logged_in(browser)


def test_an_operator_command_lifts_the_lock_at_once(operator):
    _guess(settings.AXES_FAILURE_LIMIT)
    assert _log_in(Client(), PASSWORD) == 429
    out = StringIO()
    call_command("operator_unlock", NAME, stdout=out)
    assert "unlocked" in out.getvalue()
    unlocked = AuditEvent.objects.get(kind="operator.unlocked", target=f"operator:{NAME}")
    assert unlocked.actor == f"operator:manage.py:{getpass.getuser()}"  # who ran it, never "hub"
    browser = Client()
    assert _log_in(browser, PASSWORD) == 302 and _logged_in(browser)


@pytest.fixture
def root_browser(operator: str) -> Client:
    """A browser logged in to the Django admin as a superuser, `root`, beside the operator `ada`."""
    root = get_user_model().objects.create_superuser("root", password="root-password-1")
    browser = Client()
    browser.force_login(root)
    return browser


def test_the_admin_unlocks_a_login_through_the_audited_service(root_browser):
    """Given `ada` locked out, when a superuser selects her failed attempts in the admin and runs
    the unlock action, then she logs in again and the audit names who unlocked her."""
    _guess(settings.AXES_FAILURE_LIMIT)
    assert _log_in(Client(), PASSWORD) == 429
    attempts = list(AccessAttempt.objects.filter(username=NAME).values_list("pk", flat=True))

    answer = root_browser.post(
        "/admin/axes/accessattempt/", {"action": "attempts_unlock", "_selected_action": attempts}
    )

    assert answer.status_code == 302
    event = AuditEvent.objects.get(kind="operator.unlocked")
    assert (event.actor, event.target) == ("operator:root", f"operator:{NAME}")
    assert _log_in(Client(), PASSWORD) == 302


def test_the_admin_cannot_unlock_by_deleting_or_editing_the_lockout_record(root_browser):
    """Deleting or editing a failed attempt would unlock the login with no audit: the admin
    refuses both (403), and the bulk delete is gone; the lockout stands."""
    _guess(settings.AXES_FAILURE_LIMIT)
    attempt = AccessAttempt.objects.get(username=NAME)
    page = "/admin/axes/accessattempt/"
    assert root_browser.post(f"{page}{attempt.pk}/delete/", {"post": "yes"}).status_code == 403
    edit = {"username": "someone-else", "failures_since_start": 0}
    assert root_browser.post(f"{page}{attempt.pk}/change/", edit).status_code == 403
    root_browser.post(page, {"action": "delete_selected", "_selected_action": [attempt.pk], "post": "yes"})
    for path in ("axes/accesslog", "axes/accessfailurelog"):
        assert root_browser.get(f"/admin/{path}/").status_code == 200
        assert root_browser.get(f"/admin/{path}/add/").status_code == 403

    assert AccessAttempt.objects.get(pk=attempt.pk).failures_since_start == attempt.failures_since_start
    assert _log_in(Client(), PASSWORD) == 429
    assert not AuditEvent.objects.filter(kind="operator.unlocked").exists()


@pytest.mark.parametrize("weak", ["password", "password1234", "123456789012", "ada-operator", "short-pw"])
def test_operator_create_refuses_a_weak_password(db, monkeypatch, weak):
    """`operator_create` runs Django's password validators: common, numeric, too short, or too
    like the username are refused and no login is made."""
    monkeypatch.setattr("sys.stdin", StringIO(weak + "\n"))
    with pytest.raises(CommandError):
        call_command("operator_create", "ada-operator", "--password-stdin")
    assert not get_user_model().objects.filter(username="ada-operator").exists()


def test_an_idle_console_session_expires(operator):
    """Given a logged-in operator, when no request comes for longer than the idle timeout, then the
    next page asks for the login again; a request inside the window moves the expiry on."""
    browser = Client()
    assert _log_in(browser, PASSWORD) == 302
    idle = settings.SESSION_COOKIE_AGE
    assert idle <= 24 * 3600, "the idle timeout defaults to hours, not weeks"
    start = timezone.now()
    with time_machine.travel(start + timedelta(seconds=idle * 0.75), tick=False):
        assert _logged_in(browser)  # active: the session is kept
    with time_machine.travel(start + timedelta(seconds=idle * 1.5), tick=False):
        assert _logged_in(browser)  # 0.75 of the timeout since the last request
    with time_machine.travel(start + timedelta(seconds=idle * 2.6), tick=False):
        response = browser.get("/")
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_secure_cookies_setting_makes_session_and_csrf_cookies_https_only(tmp_path):
    """SWITCHBOARD_SECURE_COOKIES=1 (a TLS deployment) sets Secure on the session and CSRF cookies;
    the idle timeout is SWITCHBOARD_SESSION_IDLE_SECONDS."""
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SESSION_COOKIE_AGE, s.SESSION_SAVE_EVERY_REQUEST)"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "hub.settings",
        "SWITCHBOARD_HOME": str(tmp_path),
        "SWITCHBOARD_SECRET_KEY": "k" * 50,
    }
    on = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "SWITCHBOARD_SECURE_COOKIES": "1", "SWITCHBOARD_SESSION_IDLE_SECONDS": "900"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert on.stdout.split() == ["True", "True", "900", "True"]
    off = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert off.stdout.split()[:2] == ["False", "False"]


@pytest.mark.django_db
def test_the_csrf_cookie_is_http_only_so_a_page_on_another_port_cannot_read_or_replace_it():
    """Cookies are per host, not per port: a page on 127.0.0.1:<other port> sees every cookie of
    127.0.0.1 its script may read. Neither console cookie may be one (the browser test:
    tests/e2e/test_cross_origin_browser.py)."""
    get_user_model().objects.create_user(NAME, password=PASSWORD, is_staff=True)
    client = Client()
    client.get("/login/")
    assert _log_in(client, PASSWORD) == 302
    assert client.cookies["csrftoken"]["httponly"] and client.cookies["sessionid"]["httponly"]
    assert client.cookies["csrftoken"]["samesite"] == client.cookies["sessionid"]["samesite"] == "Lax"
