"""LAN discovery (mDNS) is an announcement anyone on the network can make, naming any key and any
address. A hub uses what it finds only for keys an operator pinned, but the address is still the
announcer's word: a host on the LAN announcing a pinned key at an address of its own would get
that hub's forwards (sealed: unread, but its answers, "delivered" or "read", believed and the
message lost) and its "do you host X?" calls; at a loopback address, it would have the hub call
its own machine's services. So an announcement's address must be one a LAN hub can have, and a
key announced at two addresses (or two keys at one) is used at neither until the disagreement
has passed. Nothing here opens a connection: announcements are fed to the browser's handler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from tests.federation.conftest import OtherHub, federation_isolated, pin_hub

pytest.importorskip("zeroconf")


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    federation_isolated(settings, tmp_path)


@pytest.fixture(autouse=True)
def _fresh_discovery(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from federation.services import mdns

    monkeypatch.setattr(mdns, "_found", {})
    if hasattr(mdns, "_conflicts"):
        monkeypatch.setattr(mdns, "_conflicts", {})
    yield


class _Info:
    def __init__(self, key: str, addresses: list[str], port: int) -> None:
        self.properties = {b"key": key.encode(), b"name": b"hub"}
        self._addresses = addresses
        self.port = port

    def parsed_addresses(self) -> list[str]:
        return self._addresses


class _Zeroconf:
    """Answers the browser's lookup with the announcement being made."""

    def __init__(self, info: _Info) -> None:
        self.info = info

    def get_service_info(self, service_type: str, name: str, timeout: int = 0) -> _Info:
        return self.info


def _announce(key: str, *addresses: str, port: int = 8765) -> None:
    from zeroconf import ServiceStateChange

    from federation.services.mdns import SERVICE, _on_change

    info = _Info(key, list(addresses), port)
    _on_change(_Zeroconf(info), SERVICE, f"x.{SERVICE}", ServiceStateChange.Added)


@pytest.fixture
def pinned(db: None) -> OtherHub:
    """A hub whose key an operator pinned without an address (found by mDNS)."""
    hub = OtherHub(SigningKey.generate(), name="pinned")
    pin_hub(hub, "lan")
    return hub


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.251"])
def test_an_announcement_at_an_address_no_lan_hub_has_is_not_used(pinned: OtherHub, address: str) -> None:
    from federation.services.forwarding import lan_peer_urls
    from federation.services.keys import lan_peer_key

    _announce(pinned.public_key, address, port=6379)

    assert lan_peer_urls() == []
    assert lan_peer_key(f"http://{address}:6379") is None


def test_a_second_address_announced_for_a_pinned_key_makes_neither_a_route(pinned: OtherHub) -> None:
    """The pinned hub announces itself at 192.0.2.7; another host then announces the same key at
    its own address. Neither address is used for the key until the disagreement has passed."""
    from federation.services.forwarding import lan_peer_urls
    from federation.services.keys import lan_peer_key

    _announce(pinned.public_key, "192.0.2.7")
    assert lan_peer_key("http://192.0.2.7:8765") == pinned.public_key  # one announcement: used

    _announce(pinned.public_key, "192.0.2.66")

    assert lan_peer_key("http://192.0.2.66:8765") is None
    assert lan_peer_key("http://192.0.2.7:8765") is None
    assert lan_peer_urls() == []


def test_another_pinned_key_announced_at_a_hubs_address_makes_it_no_route(pinned: OtherHub) -> None:
    """Two pinned keys announced at one address: the hub there holds one of them at most, and
    sealing to the other would only be refused; neither is used there."""
    from federation.services.keys import lan_peer_key

    other = OtherHub(SigningKey.generate(), name="other")
    pin_hub(other, "lan")
    _announce(pinned.public_key, "192.0.2.7")
    _announce(other.public_key, "192.0.2.7")

    assert lan_peer_key("http://192.0.2.7:8765") is None


def test_the_same_announcement_again_keeps_the_route(pinned: OtherHub) -> None:
    from federation.services.keys import lan_peer_key

    for _ in range(3):
        _announce(pinned.public_key, "192.0.2.7")

    assert lan_peer_key("http://192.0.2.7:8765") == pinned.public_key


def test_a_hub_on_two_networks_keeps_its_route_whatever_order_it_lists_them_in(pinned: OtherHub) -> None:
    """A hub announces every address it has, in no fixed order: the same addresses in another
    order are no second address."""
    from federation.services.keys import lan_peer_key

    _announce(pinned.public_key, "192.0.2.7", "198.51.100.7")
    _announce(pinned.public_key, "198.51.100.7", "192.0.2.7")

    assert lan_peer_key("http://192.0.2.7:8765") == pinned.public_key
