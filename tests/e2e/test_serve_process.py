"""`switchboard serve` as a real process, driven over HTTP by three sessions."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e


def register(client: httpx.Client, key: str, name: str, **fields: object) -> dict:
    r = client.post(
        "/api/v1/sessions", json={"name": name, **fields}, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 201, r.text
    return r.json()


def auth(session: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {session['token']}"}


def test_three_sessions_over_http_against_a_real_hub(hub):
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        key = hub.enroll_key
        assert stat.S_IMODE(os.stat(hub.home / "enroll.key").st_mode) == 0o600
        alice = register(client, key, "alice", cwd="/work/a")
        bob = register(client, key, "bob", cwd="/work/b")
        carol = register(client, key, "carol", cwd="/work/c")

        names = {a["name"] for a in client.get("/api/v1/agents", headers=auth(carol)).json()["agents"]}
        assert names == {"alice", "bob", "carol"}

        # Bob long-polls; Alice's message arrives while he waits.
        got: dict = {}

        def poll() -> None:
            got["response"] = client.get("/api/v1/inbox", params={"wait": 10}, headers=auth(bob))

        waiter = threading.Thread(target=poll)
        started = time.monotonic()
        waiter.start()
        time.sleep(0.5)
        sent = client.post(
            "/api/v1/messages", json={"to": "bob", "message": "build is green"}, headers=auth(alice)
        )
        assert sent.status_code == 201 and sent.json()["status"] == "queued"
        waiter.join(timeout=15)
        assert time.monotonic() - started < 10, "the long-poll should return when the message arrives"
        messages = got["response"].json()["messages"]
        assert [m["text"] for m in messages] == ["build is green"]

        mid = sent.json()["id"]
        assert client.get(f"/api/v1/messages/{mid}", headers=auth(alice)).json()["status"] == "delivered"
        client.post("/api/v1/inbox/ack", json={"ids": [mid]}, headers=auth(bob))
        history = client.get(f"/api/v1/messages/{mid}", headers=auth(alice)).json()
        assert history["status"] == "read"

        # Carol replies to both; an ambiguous prefix is refused, not guessed.
        register(client, key, "bobby")
        r = client.post("/api/v1/messages", json={"to": "bob", "message": "hi"}, headers=auth(carol))
        assert r.status_code == 201, "an exact name wins over a longer name it prefixes"
        r = client.post("/api/v1/messages", json={"to": "bo", "message": "hi"}, headers=auth(carol))
        assert r.status_code == 404
        client.post("/api/v1/messages", json={"to": "bobb", "message": "hey bobby"}, headers=auth(carol))

        assert client.get("/api/docs").status_code == 200
    # Every message is in the database: its files are the owner's alone, like the keys.
    for name in ("switchboard.sqlite3", "switchboard.sqlite3-wal", "switchboard.sqlite3-shm"):
        assert stat.S_IMODE(os.stat(hub.home / name).st_mode) == 0o600, name
    assert hub.stop() == 0, hub.log.read_text()
    assert "Switchboard hub stopped." in hub.log.read_text()


def test_messages_survive_a_restart(tmp_path):
    """Accepted means persisted: a queued message is still there after the hub restarts."""
    from hub_topology.embedded import start_hub

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    first = start_hub(home)
    with httpx.Client(base_url=first.url, timeout=10) as client:
        alice = register(client, first.enroll_key, "alice")
        bob = register(client, first.enroll_key, "bob")
        client.post("/api/v1/messages", json={"to": "bob", "message": "kept"}, headers=auth(alice))
    first.stop()
    second = start_hub(home)
    try:
        with httpx.Client(base_url=second.url, timeout=10) as client:
            messages = client.get("/api/v1/inbox", headers=auth(bob)).json()["messages"]
            assert [m["text"] for m in messages] == ["kept"]
    finally:
        second.stop()


def test_the_cli_with_the_hubs_home_finds_the_hub_on_whatever_port_it_took(hub):
    """`switchboard serve` writes where it listens into its home (0600), beside the enrollment key:
    a `switchboard` command given only that home reaches it, with no SWITCHBOARD_URL."""
    import subprocess
    import sys

    from hub_topology import REPO

    written = hub.home / "hub.url"
    assert written.read_text().strip() == hub.url and stat.S_IMODE(written.stat().st_mode) == 0o600
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_HOME"] = str(hub.home)
    done = subprocess.run(
        [sys.executable, "-m", "switchboard_agent.cli", "register", "--name", "found-it", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        me = client.get(
            "/api/v1/ping", headers={"Authorization": f"Bearer {json.loads(done.stdout)['token']}"}
        )
    assert me.status_code == 200
