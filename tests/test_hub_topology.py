"""The loopback ports the test and benchmark harness hands out for hubs it is about to start."""

from __future__ import annotations

import socket

import pytest

import hub_topology
from hub_topology import free_port


def test_a_port_handed_out_is_below_the_kernels_ephemeral_range_so_no_port_0_listener_takes_it():
    # A port-0 bind (any test's own listener) gets a port from the ephemeral range; a hub's port
    # picked, let go and bound a moment later must not be one of those.
    first_ephemeral = hub_topology._ephemeral_first()
    ports = [free_port() for _ in range(20)]
    assert all(1024 <= port < first_ephemeral for port in ports), ports
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert listener.getsockname()[1] not in ports


def test_each_xdist_worker_and_a_run_without_workers_has_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch):
    slices = []
    for worker in ("gw0", "gw1", None):
        if worker is None:
            monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        else:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append({free_port() // hub_topology._RESERVED_SLICE for _ in range(5)})
    assert all(len(s) == 1 for s in slices), slices
    assert len({min(s) for s in slices}) == 3, slices


def test_a_port_is_not_handed_out_twice_nor_while_something_listens_on_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(hub_topology, "_handed_out", set())
    monkeypatch.setattr(hub_topology.secrets, "randbelow", lambda n: 0)
    port = free_port()
    assert free_port() != port  # handed out, though nothing has bound it yet
    hub_topology._handed_out.clear()
    with socket.create_server(("127.0.0.1", port)):
        assert free_port() != port
