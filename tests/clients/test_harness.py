"""The namespace harness itself: a hub started in it answers there and nowhere else."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.clients.harness import hub_in, netns

pytestmark = [pytest.mark.e2e, pytest.mark.clients]


def test_hub_in_a_namespace_answers_inside_and_is_out_of_reach_outside(tmp_path: Path) -> None:
    with netns() as space:
        hub = hub_in(space, tmp_path)
        peer = hub.register("peer")
        assert hub.call("GET", "ping", peer["token"])["status"] == 200
        assert (tmp_path / ".switchboard" / "enroll.key").exists()
        try:  # the same address outside the namespace is another host's loopback
            outside = httpx.get(
                f"{hub.url}/api/v1/ping", headers={"Authorization": f"Bearer {peer['token']}"}, timeout=2
            ).status_code
        except httpx.HTTPError:
            outside = None
        assert outside != 200
