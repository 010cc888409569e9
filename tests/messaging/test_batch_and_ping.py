"""Batch sends (each item checked exactly as a single send) and the authenticated no-op ping."""

from __future__ import annotations


def test_a_batch_accepts_the_good_items_reports_the_bad_in_place_and_delivers_in_order(api, register):
    # Given alice and bob
    alice, bob = register("alice"), register("bob")

    # When alice sends a batch with one unknown recipient in the middle
    r = api.post(
        "messages/batch",
        alice.token,
        {
            "messages": [
                {"to": "bob", "message": "one"},
                {"to": "nobody", "message": "x"},
                {"to": "bob", "message": "two"},
            ]
        },
    )

    # Then the good ones are accepted, the bad one carries the error a single send would give
    assert r.status_code == 201, r.json_body
    body = r.json_body
    assert (body["accepted"], body["failed"]) == (2, 1)
    assert [x["index"] for x in body["results"]] == [0, 1, 2]
    assert body["results"][1]["error"] == "not_found"
    assert body["results"][0]["status"] == "queued" and body["results"][0]["to"]["ref"] == bob.ref
    # And bob gets the two, in order
    pulled = api.get("inbox", bob.token).json_body["messages"]
    assert [m["id"] for m in pulled] == [body["results"][0]["id"], body["results"][2]["id"]]


def test_a_batch_applies_the_single_send_rules_to_each_item(api, register):
    alice, _bob = register("alice"), register("bob")
    r = api.post(
        "messages/batch",
        alice.token,
        {
            "messages": [
                {"to": "bob", "message": "   "},
                {"to": "*", "message": "hi all"},
                {"to": "bob", "message": "same key", "idempotency_key": "k"},
                {"to": "bob", "message": "same key", "idempotency_key": "k"},
            ]
        },
    )
    results = r.json_body["results"]
    assert results[0]["error"] == "invalid" and results[1]["error"] == "invalid"
    assert results[3]["duplicate"] is True and results[3]["id"] == results[2]["id"]


def test_an_empty_or_oversized_batch_is_refused(api, register):
    alice, _bob = register("alice"), register("bob")
    assert api.post("messages/batch", alice.token, {"messages": []}).status_code == 400
    too_many = {"messages": [{"to": "bob", "message": f"m{i}"} for i in range(1001)]}
    refused = api.post("messages/batch", alice.token, too_many)
    assert refused.status_code == 400 and refused.json_body["error"] == "invalid"
    assert "at most 1000" in refused.json_body["detail"]


def test_a_batch_needs_a_session_token(api, register, operator_token):
    register("bob")
    assert api.post("messages/batch", None, {"messages": [{"to": "bob", "message": "x"}]}).status_code == 401
    assert (
        api.post("messages/batch", operator_token, {"messages": [{"to": "bob", "message": "x"}]}).status_code
        == 403
    )


def test_ping_answers_authenticated_callers_only(api, register, operator_token):
    alice = register("alice")
    assert api.get("ping", alice.token).json_body == {"ok": True, "caller": f"session:alice [{alice.ref}]"}
    assert api.get("ping", operator_token).json_body["ok"] is True
    assert api.get("ping").status_code == 401
