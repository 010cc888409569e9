"""The API's own ASGI handler: same answers and headers as through Django's full middleware chain,
the console's staff login still works on the API (with its CSRF check), and request threads are
reused instead of being made per request."""

from __future__ import annotations

import threading

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.signals import request_finished, request_started

from hub.api_asgi import ApiHandler, is_api_request
from hub.asgi import application
from messaging.services.sessions import session_register

pytestmark = [pytest.mark.django_db(transaction=True)]


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://localhost")


@sync_to_async
def new_session_token(name: str) -> str:
    return session_register(name=name).token


@sync_to_async
def new_staff_user() -> None:
    get_user_model().objects.create_user("ops", password="pw-for-tests-only", is_staff=True)


@pytest.mark.asyncio
async def test_an_api_call_answers_with_the_consoles_security_headers() -> None:
    token = await new_session_token("alice")
    async with client() as http:
        ok = await http.get("/api/v1/ping", headers={"Authorization": f"Bearer {token}"})
        refused = await http.get("/api/v1/ping", headers={"Authorization": "Bearer not-a-token"})
    assert ok.status_code == 200
    assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    for response in (ok, refused):
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["Referrer-Policy"] == "same-origin"
        assert response.headers["Content-Length"] == str(len(response.content))  # not sent chunked


@pytest.mark.asyncio
async def test_a_staff_login_acts_as_operator_on_the_api_and_its_csrf_check_still_applies() -> None:
    await new_staff_user()
    async with client() as http:
        login_page = await http.get("/login/")  # the console (full middleware) sets the CSRF cookie
        csrf = login_page.cookies["csrftoken"]
        logged_in = await http.post(
            "/login/",
            data={"username": "ops", "password": "pw-for-tests-only", "csrfmiddlewaretoken": csrf},
            headers={"Referer": "http://localhost/login/"},
        )
        assert logged_in.status_code == 302
        listed = await http.get("/api/v1/holds")
        without_csrf = await http.post("/api/v1/holds/decide", json={"ids": [1], "approve": True})
        with_csrf = await http.post(
            "/api/v1/holds/decide",
            json={"ids": [1], "approve": True},
            headers={"X-CSRFToken": http.cookies["csrftoken"], "Referer": "http://localhost/"},
        )
    assert listed.status_code == 200, listed.text
    assert without_csrf.status_code == 403
    assert with_csrf.status_code == 200, with_csrf.text
    assert with_csrf.json()["skipped"] == [1]  # no such hold; the point is the operator got through


@pytest.mark.asyncio
async def test_sequential_api_calls_reuse_one_request_thread() -> None:
    token = await new_session_token("alice")
    served_by: set[str] = set()

    def note_thread(**_: object) -> None:  # a sync receiver runs on the request's thread
        served_by.add(threading.current_thread().name)

    request_started.connect(note_thread)
    try:
        async with client() as http:
            for _ in range(20):
                answer = await http.get("/api/v1/ping", headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 200
    finally:
        request_started.disconnect(note_thread)
    assert len(served_by) == 1, served_by  # Django's own handler starts 20 threads, one per request


@pytest.mark.asyncio
async def test_a_sync_api_view_is_served_in_one_hop_and_an_async_one_by_djangos_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """request_started, the view and request_finished (the connection handed back) run on the
    request's thread in one call for a sync view; the long-polling inbox (async) gets Django's cycle."""
    token = await new_session_token("alice")
    through_djangos_cycle: list[str] = []
    on_threads: list[tuple[str, str]] = []
    djangos_handle = ApiHandler.handle

    async def handle(self: ApiHandler, scope: dict, receive: object, send: object) -> None:
        through_djangos_cycle.append(scope["path"])
        await djangos_handle(self, scope, receive, send)

    def started(**_: object) -> None:
        on_threads.append(("started", threading.current_thread().name))

    def finished(**_: object) -> None:
        on_threads.append(("finished", threading.current_thread().name))

    monkeypatch.setattr(ApiHandler, "handle", handle)
    request_started.connect(started)
    request_finished.connect(finished)
    try:
        async with client() as http:
            auth = {"Authorization": f"Bearer {token}"}
            ping = await http.get("/api/v1/ping", headers=auth)
            (lane,) = {name for _, name in on_threads}
            unknown = await http.get("/api/v1/no-such-thing", headers=auth)
            inbox = await http.get("/api/v1/inbox", params={"wait": 0}, headers=auth)
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
    assert ping.status_code == 200 and unknown.status_code == 404 and inbox.status_code == 200, inbox.text
    assert unknown.headers["X-Frame-Options"] == "DENY"
    assert through_djangos_cycle == ["/api/v1/inbox"]
    assert on_threads[:2] == [("started", lane), ("finished", lane)]
    assert lane != threading.current_thread().name


@pytest.mark.django_db(transaction=False)
def test_only_api_paths_take_the_api_handler() -> None:
    assert is_api_request({"path": "/api/v1/ping"})
    assert is_api_request({"path": "/hub/api/v1/ping", "root_path": "/hub"})
    assert not is_api_request({"path": "/apiary"})
    assert not is_api_request({"path": "/login/"})
    assert not is_api_request({"path": "/holds/"})


def test_requests_do_not_close_the_in_process_cache() -> None:
    """Django's default cache has nothing to close; the hub skips that per-request step."""
    from django.core.cache import close_caches

    assert not any(receiver is close_caches for receiver in request_finished._live_receivers(None)[0])


def _settings_in_a_fresh_process(tmp_path, **env: str) -> str:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_") and k != "DATABASE_URL"}
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'hub.settings'; django.setup(); "
        "from django.conf import settings; print(repr(settings.DATABASES['default']['CONN_MAX_AGE']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "SWITCHBOARD_HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.django_db(transaction=False)
def test_the_embedded_sqlite_connection_is_kept_unless_configured(tmp_path) -> None:
    """Opening a SQLite connection costs more than most requests; the reused request threads keep
    theirs. An explicit SWITCHBOARD_DB_CONN_MAX_AGE still wins."""
    assert _settings_in_a_fresh_process(tmp_path) == "None"
    assert _settings_in_a_fresh_process(tmp_path, SWITCHBOARD_DB_CONN_MAX_AGE="0") == "0"
