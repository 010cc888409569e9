"""The enrollment key kept in a home folder belongs to the hub that runs with that home: the agent
side hands it only to that hub (the address the hub wrote there, or one on this machine), never to
a hub elsewhere that SWITCHBOARD_URL names. A key set in SWITCHBOARD_ENROLL_KEY is the user's
explicit choice and goes to whichever hub is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard_agent.client import HubClient, NotConfigured
from switchboard_agent.config import HUB_URL_FILE, enroll_key
from switchboard_agent.transport import Response

LOCAL_KEY = "sbe_local_hub_key_never_for_another"
ELSEWHERE = "http://hub.elsewhere.test:8765"  # never contacted: the transport below records instead


class Recording:
    """A transport that records each request it is handed and answers 201."""

    def __init__(self) -> None:
        self.requests: list[object] = []

    def handle(self, request: object) -> Response:
        self.requests.append(request)
        return Response(201, b'{"session_id": "x", "token": "t", "ref": "r", "name": "n"}')

    def close(self) -> None:
        pass


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir(mode=0o700)
    (folder / "enroll.key").write_text(LOCAL_KEY)
    (folder / HUB_URL_FILE).write_text("http://127.0.0.1:8800")
    monkeypatch.setenv("SWITCHBOARD_HOME", str(folder))
    monkeypatch.delenv("SWITCHBOARD_ENROLL_KEY", raising=False)
    return folder


def test_registering_with_a_hub_elsewhere_does_not_send_it_this_home_s_enrollment_key(home: Path) -> None:
    # Given a home whose hub's enrollment key is kept there, and a client pointed at another hub
    transport = Recording()
    client = HubClient(url=ELSEWHERE, transport=transport)

    # When it registers without a key of its own, then it is told to name that hub's key
    with pytest.raises(NotConfigured, match="SWITCHBOARD_ENROLL_KEY"):
        client.register(name="alice", cwd="/w")

    # And nothing was sent there: the other hub never saw this home's key
    assert transport.requests == []


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8800", "http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"],
)
def test_the_home_s_key_goes_to_its_own_hub_and_to_a_hub_on_this_machine(home: Path, url: str) -> None:
    assert enroll_key(url) == LOCAL_KEY


def test_the_home_s_key_goes_to_the_address_its_hub_wrote_there_whatever_the_host(home: Path) -> None:
    (home / HUB_URL_FILE).write_text("http://hub-host.test:8765")  # a hub listening on a LAN name
    assert enroll_key("http://hub-host.test:8765/") == LOCAL_KEY
    assert enroll_key(ELSEWHERE) is None


def test_a_key_set_in_the_environment_goes_to_the_hub_named(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", "sbe_chosen_for_that_hub")
    assert enroll_key(ELSEWHERE) == "sbe_chosen_for_that_hub"
