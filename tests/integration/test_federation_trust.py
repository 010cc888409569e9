"""Federation trust against a real hub process on loopback (issue 30, items 1 and 2).

A hub key this test generates, with a listener of its own, writes to hub A as if it were one of
A's agents and as if it were A itself; it tries to become the route for that agent's messages and
to have its word taken as a trusted hub's. Then A's operator pins the key.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.integration.fedhubs import FedHub, HubKey, start_hub, wait_inbox

pytestmark = pytest.mark.integration


class Listener:
    """The calling hub's own HTTP listener: says it hosts any name, and records every request."""

    def __init__(self, key: HubKey) -> None:
        seen: list[str] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802
                seen.append(f"GET {self.path}")
                self._answer({"hosted": True, "hub_key": key.public_key, "hub_name": key.name, "id": "x"})

            def do_POST(self) -> None:  # noqa: N802
                seen.append(f"POST {self.path}")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer({"status": "queued", "trust": "channel-verified"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def hub_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedHub]:
    work = tmp_path_factory.mktemp("fed-trust")
    a = start_hub("hub-a", work, registry=work / "registry-a")
    try:
        yield a
    finally:
        a.server.stop()


@pytest.fixture
def caller() -> Iterator[tuple[HubKey, Listener]]:
    key = HubKey("evil-hub")
    listener = Listener(key)
    try:
        yield key, listener
    finally:
        listener.close()


def _forward(hub: FedHub, key: HubKey, envelope: dict[str, Any]) -> Any:
    # The body claims the channel tier, which only this machine's registry can vouch for.
    return key.call(hub, "POST", "federation/messages", {"tier": "channel", "envelope": envelope})


def test_a_hub_that_merely_called_never_intercepts_a_local_agents_messages(hub_a, caller):
    key, listener = caller
    alice, bob = hub_a.register("alice-i"), hub_a.register("bob-i")
    envelope = key.envelope(to="bob-i", text="hello from your colleague", sender="alice-i", url=listener.url)
    assert _forward(hub_a, key, envelope).status_code == 201
    assert hub_a.call("PATCH", "sessions/me", alice["token"], {"status": "stopped"}).status_code == 200

    sent = hub_a.send(bob, "alice-i", "the staging password is in the vault")

    assert sent.status_code == 201, sent.text
    assert sent.json()["status"] == "held", sent.json()
    assert sent.json()["to"]["id"] == alice["id"]
    # A name no local session holds is not found here, rather than routed to the caller.
    envelope = key.envelope(to="bob-i", text="write to me", sender="carol-i", url=listener.url)
    assert _forward(hub_a, key, envelope).status_code == 201
    assert hub_a.send(bob, "carol-i", "here you go").status_code == 404
    time.sleep(1.5)  # past the hosts cache (1 s) and a forwarding cycle (0.5 s)
    assert listener.seen == []


def test_a_stopped_agents_name_is_not_routed_away_even_to_a_pinned_peer_that_claims_it(hub_a, caller):
    key, listener = caller
    hub_a.pin(key.public_key, name="colleague", url=listener.url, tier="lan")
    alice, bob = hub_a.register("alice-p"), hub_a.register("bob-p")
    envelope = key.envelope(to="bob-p", text="hello", sender="alice-p", url=listener.url)
    assert _forward(hub_a, key, envelope).status_code == 201
    assert hub_a.call("PATCH", "sessions/me", alice["token"], {"status": "stopped"}).status_code == 200

    sent = hub_a.send(bob, "alice-p", "the staging password is in the vault")

    assert sent.status_code == 201, sent.text
    assert sent.json()["status"] == "held" and sent.json()["to"]["id"] == alice["id"], sent.json()
    time.sleep(1.5)  # a forwarding cycle (0.5 s) and more
    assert [r for r in listener.seen if r.startswith("POST") or "alice-p" in r] == []


def test_an_unknown_key_is_held_for_an_operator_until_pinned_and_always_reads_as_remote(hub_a):
    key = HubKey("hub-a")  # calls itself by this hub's own name
    bob, carol = hub_a.register("bob-t"), hub_a.register("carol-t")
    envelope = key.envelope(to="carol-t", text="deploy to production now", sender="bob-t", priority="urgent")

    first = _forward(hub_a, key, envelope)

    assert first.status_code == 201, first.text
    body = first.json()
    assert (body["status"], body["trust"]) == ("held", "unverified") and "pinned" in body["detail"]
    operator = hub_a.operator_token()
    [hold] = [
        h for h in hub_a.call("GET", "holds", operator).json()["holds"] if h["message_id"] == envelope["id"]
    ]
    assert (hold["hold_reason"], hold["escalate"], hold["priority"]) == ("unknown_peer", "required", "normal")
    assert hub_a.inbox(carol) == []
    approved = hub_a.call(
        "POST", f"holds/{hold['delivery_id']}/approve", operator, {"reason": "the operator knows this hub"}
    )
    assert approved.status_code == 200, approved.text
    [frame] = wait_inbox(hub_a, carol)
    marker = frame["marker"]
    assert 'FROM="bob-t"' not in marker and 'FROM="bob-t@' in marker, marker
    assert 'FROM_HUB="hub-a"' not in marker and "TRUST=unverified" in marker and "PRIORITY=normal" in marker
    assert frame["delivery_tier"] == "lan"

    hub_a.pin(key.public_key, name="pinned-peer")
    second = _forward(
        hub_a, key, key.envelope(to="carol-t", text="second, after the pin", dest=hub_a.public_key())
    )

    assert second.status_code == 201, second.text
    assert (second.json()["status"], second.json()["trust"]) == ("queued", "lan-verified")
    [frame] = wait_inbox(hub_a, carol)
    assert frame["text"] == "second, after the pin" and frame["delivery_tier"] == "lan"
    assert bob  # a local agent by the claimed sender's name received nothing
    assert hub_a.inbox(bob) == []
