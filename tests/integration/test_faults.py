"""Fault tests on the real topology. Each records every operation and then checks the books with
`ledger_problems`: every accepted message in exactly one end state, none lost, none received twice
without a recorded retry, and one audit event per change."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import httpx
import pytest

from tests.integration.harness import VENV_BIN, database_create, rss_mb, wait_until
from tests.integration.ledger import (
    LOAD_ENV,
    InboxReader,
    Ledger,
    SendLoad,
    SocketReceiver,
    WebSocketAgent,
    ledger_problems,
    socket_path,
    stalled_websocket,
)

pytestmark = pytest.mark.integration


def test_fifty_concurrent_sends_with_one_idempotency_key_make_one_message(hub):
    # Given a sender and a recipient, and 50 clients ready to send the same request at once
    alice = hub.register("alice-idem", web=0)
    bob = hub.register("bob-idem", web=1)
    barrier = threading.Barrier(50, timeout=30)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        with hub.client(i % 2, headers=alice.headers) as c:
            barrier.wait()
            r = c.post(
                "/api/v1/messages", json={"to": bob.ref, "message": "once only", "idempotency_key": "k-1"}
            )
        with lock:
            responses.append(r)

    # When all 50 send through both web processes at the same moment
    threads = [threading.Thread(target=send, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    # Then every answer is a 201 naming the same message, exactly one of them the original
    assert len(responses) == 50
    assert Counter(r.status_code for r in responses) == {201: 50}, [
        r.text for r in responses if r.status_code != 201
    ]
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(not r.json()["duplicate"] for r in responses) == 1
    # And the database holds one message, one delivery and one acceptance in the audit
    (count,) = hub.sql(
        "SELECT count(*) FROM messaging_message WHERE sender_id = %s AND idempotency_key = 'k-1'", alice.id
    )[0]
    assert count == 1
    ledger = Ledger()
    ledger.sent(responses[0].json()["id"])
    reader = InboxReader(hub.web_urls[1], bob, ledger, wait=1, deadline=10)
    reader.start()
    wait_until(lambda: ledger.received, timeout=10, what="bob to receive the message")
    time.sleep(1.5)  # long enough for a second copy to show up, if there were one
    reader.stop()
    reader.drain()
    assert ledger_problems(hub, ledger, end_states={"read"}) == []


def accepted_since(sender: SendLoad, since: float) -> float:
    """When `sender` first got a send accepted (201) after `since` (monotonic), or 0 if not yet."""
    return min((at for (_, outcome, at) in list(sender.attempts) if outcome == 201 and at > since), default=0)


def test_postgresql_stops_under_load_sends_get_503_never_2xx_and_the_hub_recovers(
    postgres_cluster, private_redis, make_hub
):
    # Given a hub on a PostgreSQL cluster of its own, with senders and a reader running
    db_url = database_create(postgres_cluster.url())
    hub = make_hub(database_url=db_url, redis_url=private_redis.url(), extra_env=LOAD_ENV)
    alice, carol = hub.register("alice-pg", web=0), hub.register("carol-pg", web=1)
    bob = hub.register("bob-pg", web=1)
    ledger = Ledger()
    reader = InboxReader(hub.web_urls[1], bob, ledger, wait=2, deadline=400)
    senders = [
        SendLoad(hub.web_urls[0], alice, bob.ref, ledger, count=100_000, interval=0.01, deadline=60),
        SendLoad(hub.web_urls[1], carol, bob.ref, ledger, count=100_000, interval=0.01, deadline=60),
    ]
    reader.start()
    for s in senders:
        s.start()
    time.sleep(2)

    # When PostgreSQL crashes (immediate stop), stays down for 16 s, and comes back
    postgres_cluster.stop("immediate")
    down_from = time.monotonic()
    time.sleep(16)  # long enough for a doubling reconnection wait to reach 8 s
    down_until = time.monotonic()
    postgres_cluster.start()  # returns once PostgreSQL accepts connections
    back_at = time.monotonic()
    # Each sender sends to a web process of its own: wait for the last of them to accept one again
    recovered_at = wait_until(
        lambda: (
            all(accepted_since(s, back_at) for s in senders)
            and max(accepted_since(s, back_at) for s in senders)
        ),
        timeout=30,
        what="a send accepted by each web process after PostgreSQL came back",
    )
    time.sleep(1)
    for s in senders:
        s.halt.set()
        s.join(timeout=40)

    # Then every send made and answered while it was down got a 503 (never a 2xx, never another 5xx)
    during = [o for s in senders for (start, end, o) in s.spans if down_from < start and end < down_until]
    assert during, "no send was made and answered while the database was down"
    assert set(during) == {503}, Counter(during)
    everything = Counter(o for s in senders for (_, o, _) in s.attempts)
    assert set(everything) <= {201, 503}, everything
    # And each web process accepts sends again within 3 s of PostgreSQL accepting connections
    # (its pool tries to reconnect at least once a second, however long the outage: hub/settings.py)
    assert recovered_at - back_at < 3, f"recovered {recovered_at - back_at:.1f} s after PostgreSQL came back"
    # And retrying each refused send with its idempotency key gets it accepted exactly once
    for s in senders:
        assert s.resend_failed() == []
    keys = hub.sql(
        "SELECT idempotency_key, count(*) FROM messaging_message GROUP BY idempotency_key HAVING count(*) > 1"
    )
    assert keys == []
    sent_keys = {k for s in senders for (k, _, _) in s.attempts}
    (stored,) = hub.sql("SELECT count(*) FROM messaging_message")[0]
    assert stored == len(sent_keys)
    # And the reader gets every accepted message: one whose pull answer was lost (PostgreSQL died
    # while committing it) comes with the reader's next pull, which asks for unacked ones too
    try:
        wait_until(
            lambda: all(ledger.received[m] for m in list(ledger.accepted)),
            timeout=30,
            what="the reader to receive every accepted message",
        )
    except TimeoutError as exc:
        missing = [m for m in ledger.accepted if not ledger.received[m]]
        states = hub.sql(
            "SELECT state, count(*) FROM messaging_delivery WHERE message_id = ANY(%s::uuid[]) GROUP BY 1",
            missing,
        )
        raise AssertionError(
            f"{len(missing)} accepted messages never reached the reader (deliveries: {states}; "
            f"the reader saw {reader.errors[:3]})"
        ) from exc
    reader.stop()
    reader.drain()
    assert reader.errors, "the reader should have seen the outage too"
    assert ledger_problems(hub, ledger, end_states={"read"}) == []


def test_redis_restarted_and_emptied_under_load_loses_nothing(
    private_redis, fresh_database, make_hub, tmp_path
):
    # Given a hub on its own Redis; bob long-polls on web 1, dave takes messages on a local socket
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        migrate=False,
        extra_env={**LOAD_ENV, "SWITCHBOARD_SOCKET_TIMEOUT": "2"},
    )
    ledger = Ledger()
    receiver = SocketReceiver(socket_path("sbp"), ledger)
    receiver.start()
    alice, carol = hub.register("alice-redis", web=0), hub.register("carol-redis", web=0)
    bob = hub.register("bob-redis", web=1)
    dave = hub.register("dave-redis", web=1, peer_address=receiver.address)
    reader = InboxReader(hub.web_urls[1], bob, ledger, wait=2, deadline=400)
    senders = [
        SendLoad(hub.web_urls[0], alice, bob.ref, ledger, count=100_000, interval=0.01, deadline=60),
        SendLoad(hub.web_urls[1], carol, dave.ref, ledger, count=100_000, interval=0.01, deadline=60),
    ]
    reader.start()
    for s in senders:
        s.start()
    time.sleep(2)

    # When Redis is emptied (queued socket-write tasks vanish with it), then killed and restarted
    # empty, while they run
    private_redis.flush()
    time.sleep(1)
    private_redis.restart(pause=1.0)
    time.sleep(4)
    for s in senders:
        s.halt.set()
        s.join(timeout=40)

    # Then sends kept being accepted (the database is the truth; Redis only speeds delivery up)
    outcomes = Counter(o for s in senders for (_, o, _) in s.attempts)
    assert outcomes[201] > 0
    for s in senders:
        assert s.resend_failed() == []
    # And both recipients got every accepted message exactly once: bob by pull, dave by socket
    # writes that the sweeper drove again when their tasks were lost
    try:
        wait_until(
            lambda: all(ledger.received[m] for m in list(ledger.accepted)),
            # Lost socket writes are re-driven once their lease (9 s here) has passed, by beat and a
            # worker that must first reconnect to the new Redis: allow for a loaded machine.
            timeout=120,
            what="every accepted message to arrive after Redis came back",
        )
    finally:
        reader.stop()
        receiver.stop()
    reader.drain()
    # And the reader's long-polls kept working without Redis (answered from the database, no 5xx)
    assert not [e for e in reader.errors if e.startswith("5")], reader.errors
    # And the worker kept consuming through the loss (issue 8: it used to stop for good when Redis
    # died with a task unacknowledged)
    assert "Unrecoverable error" not in hub.worker.log()
    to_dave = [m for m, info in ledger.accepted.items() if info["key"].startswith("carol")]
    states = Counter(
        s
        for (s,) in hub.sql(
            "SELECT state FROM messaging_delivery WHERE message_id = ANY(%s::uuid[])", to_dave
        )
    )
    assert states == {"delivered": len(to_dave)}
    assert ledger_problems(hub, ledger, end_states={"read", "delivered"}) == []


def _log_times(log: str) -> list[datetime]:
    return [
        datetime.strptime(m, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        for m in re.findall(r"(?m)^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+", log)
    ]


SKEWED_CELERY = [
    str(VENV_BIN / "python"),
    "-c",
    # A worker whose clock runs two hours ahead (time-machine moves time.time and datetime.now).
    "import datetime, sys, time_machine;"
    "time_machine.travel(datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2), tick=True).start();"
    "from celery.__main__ import main; sys.argv[0] = 'celery'; sys.exit(main())",
]


def test_expiry_under_a_skewed_worker_clock_is_never_early_and_expired_is_never_delivered(
    private_redis, fresh_database, make_hub
):
    # Given a hub whose only worker's clock runs 2 hours fast, and holds for stopped sessions last 6 s
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        migrate=False,
        worker=False,
        extra_env={**LOAD_ENV, "SWITCHBOARD_STOPPED_HOLD_SECONDS": "6"},
    )
    hub.start_worker(argv_prefix=SKEWED_CELERY)
    skew = max(_log_times(hub.worker.log())) - datetime.now(UTC)
    assert 7000 < skew.total_seconds() < 7400, f"the worker's clock is not skewed: {skew}"
    alice = hub.register("alice-skew", web=0)
    bob = hub.register("bob-skew", web=1, status="stopped")
    ledger = Ledger()

    # When alice sends 20 messages to bob while he is stopped (held for him for 6 s)
    early = SendLoad(hub.web_urls[0], alice, bob.ref, ledger, count=20, tag="early")
    early.run()
    assert set(Counter(o for (_, o, _) in early.attempts)) == {201}
    assert {v["status"] for v in ledger.accepted.values()} == {"held"}
    sent_at = time.monotonic()
    held_ids = list(ledger.accepted)

    # Then for the next 4 s the fast-clocked worker sweeps every second and expires none of them
    sweeps_before = hub.worker.log().count("sweep_due_deliveries")
    while time.monotonic() - sent_at < 4:
        states = Counter(s for (s,) in hub.sql("SELECT state FROM messaging_delivery"))
        assert states == {"held": 20}, states
        time.sleep(0.25)
    assert hub.worker.log().count("sweep_due_deliveries") > sweeps_before, "the skewed worker never swept"

    # And once their deadline passes (database clock) they all expire, none before its deadline
    wait_until(
        lambda: hub.sql("SELECT count(*) FROM messaging_delivery WHERE state = 'expired'")[0][0] == 20,
        timeout=30,
        what="the holds to expire",
    )
    early_rows = hub.sql(
        "SELECT count(*) FROM messaging_delivery WHERE state = 'expired' AND final_at < expires_at"
    )
    assert early_rows == [(0,)]

    # When bob starts again and alice sends 5 more, and bob reads his inbox
    with hub.client(1, headers=bob.headers) as c:
        assert c.patch("/api/v1/sessions/me", json={"status": "idle"}).status_code == 200
    later = SendLoad(hub.web_urls[0], alice, bob.ref, ledger, count=5, tag="later")
    later.run()
    reader = InboxReader(hub.web_urls[1], bob, ledger, wait=1, deadline=20)
    reader.start()
    wait_until(
        lambda: sum(ledger.received.values()) >= 5, timeout=20, what="bob to receive the later messages"
    )
    time.sleep(1.5)
    reader.stop()
    reader.drain()

    # Then he got the 5 later messages and none of the expired ones
    assert not any(ledger.received[m] for m in held_ids)
    later_ids = [m for m in ledger.accepted if m not in held_ids]
    assert len(later_ids) == 5 and all(ledger.received[m] == 1 for m in later_ids)
    problems = ledger_problems(hub, ledger, end_states={"expired", "read"}, expect_received=False)
    assert problems == []


def test_worker_sigkilled_five_times_while_500_socket_deliveries_are_in_flight(
    private_redis, fresh_database, make_hub, tmp_path
):
    # Given five sessions taking messages on local sockets, and a hub whose socket writes time out
    # after 2 s (so a dead worker's lease runs out after 9 s)
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        migrate=False,
        webs=2,
        extra_env={**LOAD_ENV, "SWITCHBOARD_SOCKET_TIMEOUT": "2"},
    )
    ledger = Ledger()
    receivers = [SocketReceiver(socket_path(f"sbp{i}"), ledger) for i in range(5)]
    for r in receivers:
        r.start()
    alice, carol = hub.register("alice-kill", web=0), hub.register("carol-kill", web=1)
    bobs = [hub.register(f"bob-kill-{i}", web=i % 2, peer_address=r.address) for i, r in enumerate(receivers)]
    senders = [
        SendLoad(hub.web_urls[i % 2], [alice, carol][i % 2], bob.ref, ledger, count=100, tag=f"to{i}")
        for i, bob in enumerate(bobs)
    ]

    # When 500 messages are sent and the worker is SIGKILLed five times while they are written
    try:
        for s in senders:
            s.start()
        kills = 0
        while kills < 5:
            time.sleep(0.7)
            hub.worker.kill()
            kills += 1
            hub.start_worker()
        for s in senders:
            s.join(timeout=60)
        assert Counter(o for s in senders for (_, o, _) in s.attempts) == {201: 500}

        # Then every message is written and marked delivered (the sweeper re-drives what the dead
        # workers held), each received once unless the hub recorded a second attempt
        wait_until(
            lambda: hub.sql("SELECT count(*) FROM messaging_delivery WHERE state = 'delivered'")[0][0] == 500,
            timeout=90,
            what="all 500 deliveries to be written",
            interval=0.5,
        )
        time.sleep(1)
    finally:
        for r in receivers:
            r.stop()
    assert len(ledger.accepted) == 500
    assert ledger_problems(hub, ledger, end_states={"delivered"}) == []
    redriven = hub.sql("SELECT count(*) FROM messaging_delivery WHERE attempts > 1")[0][0]
    twice = sum(1 for c in ledger.received.values() if c > 1)
    print(
        f"\n500 socket deliveries, 5 worker kills: {redriven} needed a second attempt, {twice} arrived twice"
    )


def test_a_websocket_client_and_a_socket_reader_that_stop_reading_hold_bounded_memory_and_slow_nobody(
    private_redis, fresh_database, make_hub, tmp_path
):
    # Given on web 1: bob's WebSocket that stopped reading and carol's healthy one; and two local
    # sockets: dave's, which accepts but never reads, and erin's healthy one
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        migrate=False,
        extra_env={**LOAD_ENV, "SWITCHBOARD_SOCKET_TIMEOUT": "1"},
    )
    ledger, ignored = Ledger(), Ledger()
    stalled_rx = SocketReceiver(socket_path("sbps"), ignored, stall=True)
    healthy_rx = SocketReceiver(socket_path("sbph"), ledger)
    for r in (stalled_rx, healthy_rx):
        r.start()
    alice = hub.register("alice-slow", web=0)
    bob, carol = hub.register("bob-slow", web=1), hub.register("carol-slow", web=1)
    dave = hub.register("dave-slow", web=0, peer_address=stalled_rx.address)
    erin = hub.register("erin-slow", web=0, peer_address=healthy_rx.address)
    stalled_ws = stalled_websocket(hub.web_urls[1], bob)
    carol_ws = WebSocketAgent(hub.web_urls[1], carol, ledger)
    carol_ws.start()
    assert carol_ws.ready.wait(15)
    web1 = hub.webs[1].pid
    before = rss_mb(web1)

    # When alice floods bob with up to 400 messages of 64 kB (26 MB) and dave with 30, while
    # sending carol and erin 20 each
    big = "x" * 64_000
    flood = [
        SendLoad(hub.web_urls[0], alice, bob.ref, ignored, count=400, tag="bob", deadline=200),
        SendLoad(hub.web_urls[0], alice, dave.ref, ignored, count=30, tag="dave"),
    ]
    flood[0].body = lambda i: {"to": bob.ref, "message": f"{i} {big}", "idempotency_key": f"bob-{i}"}
    for f in flood:
        f.start()
    healthy = [
        SendLoad(hub.web_urls[0], alice, carol.ref, ledger, count=20, interval=0.2, tag="carol"),
        SendLoad(hub.web_urls[0], alice, erin.ref, ledger, count=20, interval=0.2, tag="erin"),
    ]
    try:
        for h in healthy:
            h.start()
        for t in healthy + flood:
            t.join(timeout=240)

        # Then carol and erin get every one of theirs, once, while the flood is still unread
        wait_until(
            lambda: all(ledger.received[m] for m in ledger.accepted),
            timeout=30,
            what="carol and erin to get their messages",
        )
        grown = rss_mb(web1) - before
    finally:
        carol_ws.stop()
        stalled_ws.close()
        for r in (stalled_rx, healthy_rx):
            r.stop()
    assert not carol_ws.errors, carol_ws.errors
    assert ledger_problems(hub, ledger, end_states={"read", "delivered"}) == []
    # And the server handed bob's stalled socket at most one window; the rest waits in the database
    to_bob = Counter(
        s
        for (s,) in hub.sql(
            "SELECT d.state FROM messaging_delivery d JOIN messaging_agentsession r ON r.id = d.recipient_id "
            "WHERE r.name = 'bob-slow'"
        )
    )
    flooded = sum(to_bob.values())
    assert flooded >= 300, f"only {flooded} flood messages were accepted; the test needs more"
    assert to_bob["delivered"] <= 100 and to_bob["queued"] == flooded - to_bob["delivered"], to_bob
    # And web 1's memory grew by well under what was sent to bob (unbounded buffering costs ~2×)
    flooded_mb = flooded * 64_000 / 2**20
    assert grown < 0.75 * flooded_mb, f"web 1 grew by {grown:.1f} MB for {flooded_mb:.0f} MB sent to bob"
    # And dave's socket never took anything: his deliveries are still queued, with attempts counted
    to_dave = hub.sql(
        "SELECT d.state, d.attempts FROM messaging_delivery d JOIN messaging_agentsession r ON r.id = d.recipient_id "
        "WHERE r.name = 'dave-slow'"
    )
    assert len(to_dave) == 30 and {s for s, _ in to_dave} == {"queued"}
    erin_lag = sorted(
        ledger.received_at[m] - info["at"]
        for m, info in ledger.accepted.items()
        if info["key"].startswith("erin")
    )
    # And erin's socket did not wait behind dave's: his stalled socket holds one write at a time,
    # so her writes keep a worker (without that, 30 queued writes to dave held both for 1 s each)
    assert erin_lag[len(erin_lag) // 2] < 5, erin_lag
    print(
        f"\nstalled readers: web 1 grew {grown:.1f} MB; bob {dict(to_bob)}; dave attempts "
        f"{sum(a for _, a in to_dave)}; erin's socket latency median {erin_lag[len(erin_lag) // 2]:.2f} s, "
        f"max {erin_lag[-1]:.2f} s"
    )
