"""The outbound-URL rule (messaging.outbound): which destinations the hub may call, decided
without any connection (IP literals, and `localhost` from /etc/hosts)."""

from __future__ import annotations

import ipaddress

import pytest

from messaging.errors import Forbidden, Invalid
from messaging.outbound import address_problem, destination_check


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.1.2.3", "::1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254",
     "fe80::1", "fc00::1", "100.64.0.1", "0.0.0.0", "::", "224.0.0.1", "239.255.255.250", "ff02::1",
     "255.255.255.255", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "192.0.2.1"],
)  # fmt: skip
def test_internal_addresses_are_refused(address):
    assert address_problem(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address):
    assert address_problem(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1/", "http://localhost:9/x", "https://[::1]/", "http://2130706433/", "http://127.1/"],
)
def test_urls_into_the_hub_are_refused(url):
    with pytest.raises(Forbidden) as refused:
        destination_check(url)
    assert refused.value.extra["reason"] == "private_destination"


@pytest.mark.parametrize(
    "url", ["ftp://example.com/", "http://user:pw@8.8.8.8/", "not a url", "http://" + "a" * 600]
)
def test_malformed_urls_are_invalid(url):
    with pytest.raises(Invalid):
        destination_check(url)


def test_the_operator_allowance_by_network_name_or_everything(settings):
    settings.SWITCHBOARD_OUTBOUND_ALLOW = ["10.1.2.0/24", "localhost"]
    assert destination_check("http://10.1.2.3/gate").address == "10.1.2.3"
    assert destination_check("http://localhost:9/").address in ("127.0.0.1", "::1")
    with pytest.raises(Forbidden):
        destination_check("http://10.1.3.1/gate")
    settings.SWITCHBOARD_OUTBOUND_ALLOW = []
    settings.SWITCHBOARD_OUTBOUND_ALLOW_PRIVATE = True
    assert destination_check("http://10.1.3.1/gate").address == "10.1.3.1"


def test_a_public_address_passes_and_is_the_one_to_connect_to():
    destination = destination_check("https://8.8.8.8:8443/hook")
    assert destination.address == "8.8.8.8" and destination.url.port == 8443
