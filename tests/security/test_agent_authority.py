"""Authority between agents (issue 30, items 15-18): each test reproduces an attack with one
session token (or an enrollment key) and checks the hub refuses it and changes nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from hub.routing import websocket_application
from messaging import consumers
from messaging.models import AgentSession
from messaging.principals import operator_principal
from messaging.services.sessions import session_deregister, session_register, session_set_status
from teams.models import Observer, QualityGate
from teams.services.gates import hook_call
from tests.sockets import closed_within
from tests.teams.hooks import Hook

# --- 15: reserved session kinds ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["remote", "Remote", " remote", "hub", "operator"])
def test_a_client_cannot_register_with_a_kind_the_hub_reserves(api, enroll_key, register, kind):
    """Given a client with the enrollment key, when it registers as `kind: "remote"` (the stand-in
    kind for another hub's agents, which discovery hides and operator isolation skips), then the
    registration is refused and no session is made."""
    refused = api.post("sessions", enroll_key, {"name": "hidden", "kind": kind})
    assert refused.status_code == 400, refused.json_body
    assert refused.json_body["reason"] == "bad_kind"
    assert not AgentSession.objects.filter(name="hidden").exists()
    # Ordinary kinds still register and are listed.
    seen = register("visible", kind="claude-code")
    names = [a["name"] for a in api.get("agents", seen.token).json_body["agents"]]
    assert "visible" in names


# --- 17: a refused policy change changes nothing ---------------------------------------------


def test_a_policy_put_refused_for_sensitive_exempt_leaves_the_policy_unchanged(api, register):
    """Given a session with the default policy, when it PUTs its own policy `refuse` together with
    `sensitive_exempt` (operators only), then the answer is 403 and neither field was saved."""
    bob = register("bob")
    before = api.get("sessions/me/policy", bob.token).json_body

    refused = api.call("PUT", "sessions/me/policy", bob.token, {"policy": "refuse", "sensitive_exempt": True})

    assert refused.status_code == 403, refused.json_body
    after = api.get("sessions/me/policy", bob.token).json_body
    assert after == before
    assert after["inbound_policy"] is None and after["sensitive_exempt"] is False


# --- 18: observers and revoked tokens --------------------------------------------------------


def test_an_observer_cannot_overwrite_the_registration_an_operator_made_for_it(api, register, operator_token):
    """Given an operator made `watcher` an observer of `worker`, when `watcher` registers itself
    as the observer of someone else, then it is refused and the operator's registration stands."""
    watcher, worker, other = register("watcher"), register("worker"), register("other")
    made = api.post("teams/observers", operator_token, {"session": watcher.id, "target_session": worker.id})
    assert made.status_code == 201, made.json_body

    refused = api.post("teams/observers", watcher.token, {"target_session": other.id})

    assert refused.status_code == 403, refused.json_body
    row = Observer.objects.get(session_id=watcher.id)
    assert str(row.target_session_id) == worker.id
    assert row.registered_by == "operator:test-operator"
    # The operator can still change it.
    moved = api.post("teams/observers", operator_token, {"session": watcher.id, "target_session": other.id})
    assert moved.status_code == 201, moved.json_body


def _socket(token: str) -> WebsocketCommunicator:
    headers = [(b"host", b"127.0.0.1:8765"), (b"authorization", f"Bearer {token}".encode())]
    return WebsocketCommunicator(websocket_application, "/ws/agent/", headers=headers)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["deregistered", "user_stopped", "reissued"])
async def test_an_open_agent_socket_closes_within_a_second_when_its_session_is_revoked(how):
    """Given a session's agent socket is open (e.g. with a stolen token), when the session
    deregisters (revoking its token), an operator stops it, or a registration retried with its
    registration key replaces its token, then the socket is closed within a second, and a new
    socket with the token is refused."""
    key = "victim-registration-key-0123456789"
    reg = await database_sync_to_async(session_register)(name="victim", registration_key=key)
    ws = _socket(reg.token)
    connected, _ = await ws.connect()
    assert connected
    assert (await ws.receive_json_from(timeout=5))["type"] == "hello"

    if how == "deregistered":
        await database_sync_to_async(session_deregister)(session=reg.session, actor=operator_principal("ops"))
    elif how == "user_stopped":
        await database_sync_to_async(session_set_status)(
            session=reg.session, status="user_stopped", actor=operator_principal("ops")
        )
    else:
        await database_sync_to_async(session_register)(name="victim", registration_key=key)

    frames, code = await closed_within(ws, 1.0)
    assert code == 4403
    assert frames[-1]["error"] == "session_closed"

    again = _socket(reg.token)
    connected, _ = await again.connect()
    if connected:  # accepted, then told and closed at once
        frames, code = await closed_within(again, 1.0)
        assert code in (4401, 4403)
    await asyncio.sleep(0)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_agent_socket_whose_token_is_replaced_just_before_it_joins_closes(monkeypatch):
    """Given a socket authenticating with a token, when a retried registration replaces that
    token after the token checked out and before the socket joined its group (so the socket
    cannot hear the `session.closed` that says so), then the socket, reading the session back
    after joining, closes with 4403 and pushes nothing."""
    key = "victim-registration-key-0123456789"
    reg = await database_sync_to_async(session_register)(name="victim", registration_key=key)
    authenticate = consumers._authenticate

    async def authenticated_then_replaced(token: str) -> Any:
        session = await authenticate(token)
        await database_sync_to_async(session_register)(name="victim", registration_key=key)
        return session

    monkeypatch.setattr(consumers, "_authenticate", authenticated_then_replaced)
    ws = _socket(reg.token)
    connected, _ = await ws.connect()
    assert connected

    frames, code = await closed_within(ws, 1.0)
    assert code == 4403
    assert [f["type"] for f in frames] == ["error"]
    assert frames[-1]["error"] == "session_closed"
    assert "replaced" in frames[-1]["detail"]


# --- 16: quality-gate URLs into the hub's own network ------------------------------------------


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A live hook on a free 127.0.0.1 port, counting what reaches it."""
    server = Hook().start()
    yield server
    server.stop()


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every outgoing HTTP request the hub starts, recorded and stopped before it connects (so a
    refused destination outside loopback is never sent traffic, fix or no fix)."""
    started: list[str] = []

    def refuse(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        started.append(str(request.url))
        raise httpx.ConnectError("the test stopped this connection", request=request)

    monkeypatch.setattr(httpx.Client, "send", refuse)
    return started


@pytest.fixture
def lead(api, register):
    """A session leading a team of its own (a lead sets its team's gates)."""
    agent = register("lead-gates")
    made = api.post("teams", agent.token, {"name": "gated"})
    assert made.status_code == 201, made.json_body
    agent.team_id = made.json_body["id"]
    return agent


def _stand_in_check(team_id: str) -> Any:
    return SimpleNamespace(
        event="task_completed", pk=1, team_id=team_id, task_id=None, member_id=None, payload={}
    )


UNSAFE = [
    "http://10.0.0.1/gate",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:127.0.0.1]:9/gate",
    "http://224.0.0.1/gate",
]


@pytest.mark.parametrize("url", UNSAFE)
def test_a_lead_cannot_point_a_gate_at_a_private_address(api, lead, connections, url):
    """Given a lead, when it sets a quality gate on a private, link-local, mapped-loopback or
    multicast address, then it is refused before any connection is made."""
    refused = api.call("PUT", f"teams/{lead.team_id}/gates/task_completed", lead.token, {"url": url})
    assert refused.status_code == 403, refused.json_body
    assert refused.json_body["reason"] == "private_destination"
    assert not QualityGate.objects.exists()
    assert connections == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_gate_on_loopback_or_a_name_resolving_to_it_is_refused_and_never_called(api, lead, hook, host):
    """Given a service listening on loopback, when a lead sets a gate on it (by address, or by a
    name that resolves to loopback), then it is refused and the service sees no request."""
    url = hook.url.replace("127.0.0.1", host)
    refused = api.call("PUT", f"teams/{lead.team_id}/gates/task_completed", lead.token, {"url": url})
    assert refused.status_code == 403, refused.json_body
    assert refused.json_body["reason"] == "private_destination"
    assert hook.received == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/gate", *UNSAFE])
def test_a_stored_gate_that_now_points_inside_is_refused_at_call_time(api, lead, connections, url):
    """Given a gate stored while it was allowed (or whose name now resolves elsewhere), when the
    hub calls it, then the call is refused before connecting and counts as a broken hook."""
    gate = QualityGate.objects.create(team_id=lead.team_id, event="task_completed", url=url)
    answer = hook_call(gate=gate, check=_stand_in_check(lead.team_id))
    assert answer.verdict == "broken" and "refused" in answer.reason
    assert connections == []


def test_an_operator_allowance_lets_a_gate_call_loopback(api, lead, hook, settings):
    """Given an operator allowed 127.0.0.1, when a lead sets a gate there, then the hub calls it."""
    settings.SWITCHBOARD_OUTBOUND_ALLOW = ["127.0.0.0/8"]
    made = api.call("PUT", f"teams/{lead.team_id}/gates/task_completed", lead.token, {"url": hook.url})
    assert made.status_code == 200, made.json_body
    answer = hook_call(gate=QualityGate.objects.get(), check=_stand_in_check(lead.team_id))
    assert answer.verdict == "accept" and len(hook.received) == 1


def test_allow_private_lets_every_private_destination_through(lead, hook, settings):
    settings.SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE = True
    gate = QualityGate.objects.create(team_id=lead.team_id, event="task_completed", url=hook.url)
    assert hook_call(gate=gate, check=_stand_in_check(lead.team_id)).verdict == "accept"


def test_the_call_connects_to_the_address_that_was_checked(lead, settings, monkeypatch):
    """Given a name the check resolves to one address (allowed), when the hub calls it, then it
    connects to that very address (with the name in the Host header) and never looks the name up
    again, so a second answer from DNS (rebinding) cannot move the connection."""
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            received.append(self.headers["Host"])
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lookups: list[str] = []

    def resolve(host: str, port: int) -> list[Any]:
        lookups.append(host)
        # First answer 127.0.0.2 (allowed below); any later lookup would say 127.0.0.1.
        return [ipaddress.ip_address("127.0.0.2" if len(lookups) == 1 else "127.0.0.1")]

    monkeypatch.setattr("messaging.outbound._resolve", resolve)
    settings.SWITCHBOARD_OUTBOUND_ALLOW = ["127.0.0.2"]
    try:
        gate = QualityGate.objects.create(
            team_id=lead.team_id, event="task_completed", url=f"http://localhost:{port}/gate"
        )
        answer = hook_call(gate=gate, check=_stand_in_check(lead.team_id))
    finally:
        server.shutdown()
        server.server_close()
    assert answer.verdict == "accept", answer
    assert received == [f"localhost:{port}"] and lookups == ["localhost"]


# --- discovery shows a session's socket inbox only to itself and operators ---------------------


def test_discovery_shows_a_socket_inbox_only_to_its_session_and_operators(api, register, operator_token):
    """Given alice registered with a socket inbox, when mallory lists the agents, then she does not
    learn the path where alice's messages are written (a path to wait on for alice's listener to
    go away); alice and an operator still see it."""
    alice = register("alice", peer_address="uds:/tmp/sb-alice/inbox.sock")
    mallory = register("mallory")

    def listed(token: str) -> dict[str, Any]:
        return {a["name"]: a for a in api.get("agents", token).json_body["agents"]}

    assert listed(mallory.token)["alice"]["peer_address"] == ""
    assert listed(alice.token)["alice"]["peer_address"] == "uds:/tmp/sb-alice/inbox.sock"
    assert listed(operator_token)["alice"]["peer_address"] == "uds:/tmp/sb-alice/inbox.sock"
