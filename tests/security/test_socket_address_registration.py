"""A `uds:` socket address names a path on the hub's own machine, which only a process there can
listen on; so only a client on that machine registers one. A registrant elsewhere (the enrollment
key handed to agents on other machines, a hub on a LAN) naming a local listener's socket would
have the hub write its messages there.

Through the real API: Django's test client stands for the connection, `REMOTE_ADDR` for its peer
and `SERVER_NAME` for the address it reached (as daphne's scope gives them)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from messaging.models import AgentSession

pytestmark = pytest.mark.django_db

SOCKET = "uds:/tmp/sb-victim/listener.sock"


def register(enroll_key: str, peer_address: str, name: str = "mallory", **connection: Any) -> Any:
    return Client().post(
        "/api/v1/sessions",
        data={"name": name, "peer_address": peer_address},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {enroll_key}",
        HTTP_HOST="testserver",  # the host named, whatever address the connection reached
        **connection,
    )


@pytest.mark.parametrize(
    "connection",
    [
        pytest.param({"REMOTE_ADDR": "192.168.1.23", "SERVER_NAME": "192.168.1.5"}, id="lan-peer"),
        pytest.param({"REMOTE_ADDR": "2001:db8::7", "SERVER_NAME": "2001:db8::1"}, id="ipv6-peer"),
        # Through a proxy the peer is the proxy, and a forwarded-for address is the client's claim.
        pytest.param({"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "127.0.0.1"}, id="x-forwarded-for"),
        pytest.param({"REMOTE_ADDR": "127.0.0.1", "HTTP_FORWARDED": "for=127.0.0.1"}, id="forwarded"),
    ],
)
def test_a_socket_address_from_a_client_not_on_this_machine_is_refused(
    enroll_key: str, connection: dict[str, str]
) -> None:
    answer = register(enroll_key, SOCKET, **connection)

    assert answer.status_code == 403, answer.json()
    assert answer.json()["reason"] == "socket_address_not_local"
    assert not AgentSession.objects.filter(name="mallory").exists()


def test_a_client_elsewhere_still_registers_without_a_socket_address(enroll_key: str) -> None:
    answer = register(enroll_key, "", REMOTE_ADDR="192.168.1.23", SERVER_NAME="192.168.1.5")

    assert answer.status_code == 201


@pytest.mark.parametrize(
    "connection",
    [
        pytest.param({"REMOTE_ADDR": "127.0.0.1"}, id="loopback"),
        pytest.param({"REMOTE_ADDR": "::1"}, id="ipv6-loopback"),
        pytest.param({"REMOTE_ADDR": "::ffff:127.0.0.1"}, id="ipv4-mapped-loopback"),
        # A local client that reached the hub at the machine's LAN address comes from that address.
        pytest.param({"REMOTE_ADDR": "192.168.1.5", "SERVER_NAME": "192.168.1.5"}, id="own-lan-address"),
        # The same on a dual-stack socket (bound to ::), which shows both ends IPv4-mapped.
        pytest.param(
            {"REMOTE_ADDR": "::ffff:192.168.1.5", "SERVER_NAME": "::ffff:192.168.1.5"},
            id="own-lan-address-dual-stack",
        ),
    ],
)
def test_a_socket_address_from_this_machine_is_registered(
    enroll_key: str, connection: dict[str, str]
) -> None:
    answer = register(enroll_key, SOCKET, name="bob", **connection)

    assert answer.status_code == 201, answer.json()
    assert AgentSession.objects.get(name="bob").peer_address == SOCKET


def test_a_registration_retried_from_this_machine_gets_its_socket_session_back(enroll_key: str) -> None:
    """A listener restarted after a crash, resending its registration with its registration key,
    gets the same session (and socket address) back, with a new token."""
    key = "k" * 43
    body = {"name": "bob", "peer_address": SOCKET, "registration_key": key}
    client = Client()
    first = client.post(
        "/api/v1/sessions",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {enroll_key}",
    )
    again = client.post(
        "/api/v1/sessions",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {enroll_key}",
    )

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"] and again.json()["reissued"] is True


@pytest.mark.parametrize(
    ("peer_address", "says"),
    [
        pytest.param("uds:relative/listener.sock", "absolute path", id="relative"),
        pytest.param("uds:/tmp/" + "x" * 120 + ".sock", "longer than", id="too-long"),
    ],
)
def test_a_socket_address_the_hub_could_never_write_to_is_refused_at_registration(
    enroll_key: str, peer_address: str, says: str
) -> None:
    answer = register(enroll_key, peer_address, REMOTE_ADDR="127.0.0.1", SERVER_NAME="127.0.0.1")
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert (body["error"], body["reason"]) == ("invalid", "bad_peer_address") and says in body["detail"]
    assert not AgentSession.objects.filter(name="mallory").exists()
