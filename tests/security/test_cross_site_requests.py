"""Requests that a page on another origin makes the operator's browser send to the console.

A page on another port of the console's host (`http://127.0.0.1:5555/` beside the hub's
`:8765`) is the same site, so SameSite=Lax sends the operator's session cookie with every request
it makes the browser send: an `<img>`, a `fetch(..., {mode: "no-cors"})`, a link. CSRF and the
Origin check keep it from posting; these are the GETs. Two did something in the operator's name:

- a conversation export (`/sessions/<id>/export`, `/teams/<id>/export`): an `<img>` or a link on
  the page ran it, downloaded it to the operator's disk and wrote `conversation.exported` (held
  text included, if asked) to the audit as the operator's act;
- any request at all moved the login's idle expiry on (`SESSION_SAVE_EVERY_REQUEST`), so a page
  left open in another tab kept the console logged in for as long as it liked.

The browser says who asked in its Fetch Metadata headers (`Sec-Fetch-Site`, `-Mode`, `-Dest`),
which a page cannot set. Reproduced here with the headers Chromium sends (the real browser is in
tests/e2e/test_cross_origin_browser.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.test import Client

from messaging.models import AuditEvent
from tests.console.conftest import operator_client  # noqa: F401  (the operator's logged-in browser)

# What Chromium sends for each kind of request from http://127.0.0.1:<other port>/.
IMAGE = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
FETCH = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}
FRAME = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}
LINK = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
# A link in an alert's e-mail or chat message, and the console's own pages.
ALERT_LINK = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
OWN_LINK = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
TYPED = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


@pytest.fixture
def pair(register: Any, send: Any) -> tuple[Any, Any]:
    alice, bob = register("alice"), register("bob")
    assert send(alice, "bob", "hi bob").status_code == 201
    return alice, bob


def _expiry(client: Client) -> Any:
    return Session.objects.get(session_key=client.session.session_key).expire_date


def _exports() -> int:
    return AuditEvent.objects.filter(kind="conversation.exported").count()


@pytest.mark.parametrize("headers", [IMAGE, FETCH, FRAME, LINK], ids=["img", "fetch", "iframe", "link"])
def test_a_page_on_another_port_cannot_export_a_conversation_in_the_operators_name(
    operator_client: Client,  # noqa: F811
    pair: tuple[Any, Any],
    headers: dict[str, str],
) -> None:
    alice, bob = pair

    response = operator_client.get(
        f"/sessions/{alice.id}/export", {"with": bob.ref, "include_held": "1"}, headers=headers
    )

    assert response.status_code == 403
    assert _exports() == 0


def test_the_consoles_own_export_link_a_typed_address_and_a_script_still_download(
    operator_client: Client,  # noqa: F811
    pair: tuple[Any, Any],
) -> None:
    alice, bob = pair
    url = f"/sessions/{alice.id}/export?with={bob.ref}"

    for headers in (OWN_LINK, TYPED, {}):  # {}: curl, or a browser without Fetch Metadata
        response = operator_client.get(url, headers=headers)
        assert response.status_code == 200, headers
        b"".join(response.streaming_content)

    assert _exports() == 3


@pytest.mark.parametrize("path", ["/favicon.ico", "/console/updates", "/holds/", "/nowhere"])
def test_a_page_on_another_port_does_not_keep_the_login_alive(
    operator_client: Client,  # noqa: F811
    path: str,
) -> None:
    before = _expiry(operator_client)

    response = operator_client.get(path, headers=IMAGE)

    assert response.status_code == 403
    assert response["X-Frame-Options"] == "DENY"
    assert "Set-Cookie" not in response.headers
    assert _expiry(operator_client) == before


def test_a_link_from_elsewhere_still_opens_a_console_page(
    operator_client: Client,  # noqa: F811
) -> None:
    """An alert's link (cross-site) and a link on another local page (same-site) open a page: a
    page only shows, and the person sees it open."""
    for headers in (ALERT_LINK, LINK, OWN_LINK, TYPED):
        assert operator_client.get("/holds/", headers=headers).status_code == 200, headers


def test_the_consoles_own_requests_pass(
    operator_client: Client,  # noqa: F811
) -> None:
    own_fetch = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
    assert operator_client.get("/console/updates", headers=own_fetch).status_code == 200
    own_image = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    assert operator_client.get("/favicon.ico", headers=own_image).status_code == 200
