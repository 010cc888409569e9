"""The three-session story from the hub core issue, through the REST API."""


def test_three_sessions_find_each_other_send_read_and_see_state(api, register, send):
    alice, bob, carol = register("alice"), register("bob"), register("carol", cwd="/work/carol")

    listed = api.get("agents", alice.token).json_body["agents"]
    assert {a["name"] for a in listed} == {"alice", "bob", "carol"}

    sent = send(alice, "bob", "please review PR 12", summary="review")
    assert sent.status_code == 201, sent.json_body
    assert sent.json_body["status"] == "queued"
    assert sent.json_body["to"]["ref"] == bob.ref
    message_id = sent.json_body["id"]

    pulled = api.get("inbox", bob.token).json_body["messages"]
    assert [m["id"] for m in pulled] == [message_id]
    assert pulled[0]["marker"].startswith('[SWITCHBOARD FROM="alice"')
    assert api.get(f"messages/{message_id}", alice.token).json_body["status"] == "delivered"

    assert api.get("inbox", bob.token).json_body["messages"] == []
    assert api.post("inbox/ack", bob.token, {"ids": [message_id]}).json_body["acked"] == [message_id]
    status = api.get(f"messages/{message_id}", alice.token).json_body
    assert status["status"] == "read"
    assert [h["state"] for h in status["history"] if h["state"]] == ["queued", "delivered", "read"]

    assert api.get(f"messages/{message_id}", carol.token).status_code == 404
