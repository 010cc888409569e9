"""An MCP server ends its session twice over when its client stops it: the stdin close ends the
server's lifespan (`Identity.close` on a worker thread), and the SIGTERM that follows runs
`Identity.close` again before the process exits at once. The second must not let the process
exit while the first is still telling the hub, or the session stays open on the hub."""

from __future__ import annotations

import threading
import time

from switchboard_agent.identity import Identity


class SlowClient:
    """A hub client whose deregistration takes until the test lets it finish."""

    def __init__(self) -> None:
        self.deregistering = threading.Event()
        self.finish = threading.Event()
        self.deregistered = False

    def deregister(self) -> None:
        self.deregistering.set()
        self.finish.wait(5)
        self.deregistered = True

    def close(self) -> None:
        pass


def test_a_second_close_waits_for_the_first_to_finish_telling_the_hub() -> None:
    # Given a server whose session is being ended on another thread (its lifespan's close)
    client = SlowClient()
    identity = Identity(url="http://127.0.0.1:9", token="sbs_x", make_client=lambda _u, _t: client)
    identity.owned = True
    first = threading.Thread(target=identity.close)
    first.start()
    assert client.deregistering.wait(5)

    # When the signal handler closes it again while the hub is still being told
    threading.Timer(0.3, client.finish.set).start()
    started = time.monotonic()
    identity.close(wait=2)

    # Then it returned only once the session was ended on the hub
    assert client.deregistered
    assert 0.2 < time.monotonic() - started < 2
    first.join(5)


def test_a_close_with_nothing_to_end_returns_at_once() -> None:
    identity = Identity(url="http://127.0.0.1:9")
    started = time.monotonic()
    identity.close(wait=2)
    identity.close(wait=2)
    assert time.monotonic() - started < 0.5
