"""Text the database cannot store (NUL) or that is not Unicode (a lone surrogate) is a 400, not a
500 — found by schemathesis against PostgreSQL, which refuses NUL in text columns."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "raw",
    [
        '{"to": "bob\\u0000", "message": "x"}',
        '{"to": "bob", "message": "a\\u0000b"}',
        '{"to": "bob", "message": "\\udc00x"}',
        '{"to": "bob", "message": "x", "\\u0000": 1}',
    ],
)
def test_a_body_with_unstorable_text_is_refused_with_the_hub_error_shape(api, register, raw):
    alice, _bob = register("alice"), register("bob")
    r = api.client.post(
        "/api/v1/messages",
        data=raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {alice.token}",
    )
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid"


def test_a_query_with_a_nul_is_refused_and_ordinary_text_still_passes(api, register):
    alice, _bob = register("alice"), register("bob")
    r = api.client.get("/api/v1/agents", {"name": "a\x00"}, HTTP_AUTHORIZATION=f"Bearer {alice.token}")
    assert r.status_code == 400
    assert r.json() == {
        "error": "invalid",
        "detail": "Text may not contain NUL characters.",
        "reason": "body",
    }
    assert api.post("messages", alice.token, {"to": "bob", "message": "naïve 🎉 text"}).status_code == 201


def test_a_body_that_is_not_json_gets_the_hub_error_shape(api, register):
    alice = register("alice")
    r = api.client.post(
        "/api/v1/messages",
        data="\x00{",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {alice.token}",
    )
    assert r.status_code == 400
    assert set(r.json()) >= {"error", "detail"}
