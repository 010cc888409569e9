"""The production topology works as one hub: two web processes, one database, one Redis."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_a_session_registered_on_one_web_process_is_found_through_the_other(hub):
    # Given sessions registered through different web processes
    alice = hub.register("alice-topo", web=0)
    bob = hub.register("bob-topo", web=1)

    # When alice asks web 1 for the roster
    with hub.client(1, headers=alice.headers) as c:
        agents = c.get("/api/v1/agents").json()["agents"]

    # Then both are there
    assert {alice.id, bob.id} <= {a["id"] for a in agents}


def test_the_web_processes_are_switchboard_web_on_uvloop(hub):
    """What compose and the README start: `switchboard web`, which puts daphne on uvloop."""
    for web in hub.webs:
        assert web.argv[1:2] == ["web"]
        assert "switchboard web: daphne on the uvloop event loop" in web.log()


def test_a_message_sent_through_one_web_process_wakes_a_long_poll_on_the_other(hub):
    """The long-poll on web 1 waits less than its own 5 s database re-check, so only the push that
    web 0 publishes through Redis after its commit can wake it with the message."""
    alice = hub.register("alice-push", web=0)
    bob = hub.register("bob-push", web=1)
    got: dict[str, object] = {}

    def poll() -> None:
        with hub.client(1, headers=bob.headers) as c:
            started = time.monotonic()
            got["response"] = c.get("/api/v1/inbox", params={"wait": 4})
            got["elapsed"] = time.monotonic() - started

    # Given bob long-polling on web 1 (waiting, with nothing queued yet)
    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1.0)

    # When alice sends through web 0
    with hub.client(0, headers=alice.headers) as c:
        sent = c.post("/api/v1/messages", json={"to": bob.ref, "message": "cross-process hello"})
    assert sent.status_code == 201, sent.text
    poller.join(timeout=15)

    # Then bob's poll on web 1 returns that message (delivered), before its own wait ran out
    response = got["response"]
    assert isinstance(response, httpx.Response) and response.status_code == 200
    assert [m["id"] for m in response.json()["messages"]] == [sent.json()["id"]]
    with hub.client(0, headers=alice.headers) as c:
        assert c.get(f"/api/v1/messages/{sent.json()['id']}").json()["status"] == "delivered"


def test_beat_and_worker_run_the_periodic_sweep(hub):
    # Given beat scheduling the sweep every second and a worker consuming from Redis
    # Then within a bounded wait the worker log shows the sweep task ran (and succeeded)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        log = hub.worker.log()
        if "messaging.tasks.sweep_due_deliveries" in log and "succeeded" in log:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the worker never ran the sweep that beat schedules:\n" + hub.worker.log()[-2000:])


def test_the_worker_gathers_the_planner_statistics_of_a_fresh_message_table(hub):
    # Given a fresh database whose message table PostgreSQL has no statistics for
    def has_statistics() -> bool:
        return bool(hub.sql("SELECT 1 FROM pg_stats WHERE tablename = 'messaging_message'"))

    assert not has_statistics()
    alice = hub.register("alice-stats", web=0)
    peers = [hub.register(f"peer-stats-{n}", web=1) for n in range(6)]  # within the per-pair rate

    # When 60 messages are sent (past autovacuum_analyze_threshold's 50 rows)
    with hub.client(0, headers=alice.headers) as c:
        for i in range(60):
            sent = c.post("/api/v1/messages", json={"to": peers[i % 6].ref, "message": f"{i}"})
            assert sent.status_code == 201, sent.text

    # Then within a few of the job's periods the worker has analyzed it (not autovacuum: its log says so)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not has_statistics():
        time.sleep(0.2)
    assert has_statistics()
    lines = [line for line in hub.worker.log().splitlines() if "gathered the planner's statistics" in line]
    assert any("messaging_message" in line for line in lines), hub.worker.log()[-2000:]


def test_a_message_sent_through_one_web_process_is_pushed_to_an_agent_websocket_on_the_other(hub):
    from tests.integration.ledger import Ledger, WebSocketAgent, ledger_problems

    # Given bob connected to the agent WebSocket of web 1, idle for longer than redis-py's old
    # 5 s default socket timeout (which used to kill idle consumers)
    alice = hub.register("alice-ws", web=0)
    bob = hub.register("bob-ws", web=1)
    ledger = Ledger()
    agent = WebSocketAgent(hub.web_urls[1], bob, ledger, deadline=60)
    agent.start()
    assert agent.ready.wait(15) and not agent.errors, agent.errors
    time.sleep(6)

    # When alice sends three messages through web 0
    with hub.client(0, headers=alice.headers) as c:
        for i in range(3):
            r = c.post("/api/v1/messages", json={"to": bob.ref, "message": f"over the socket {i}"})
            assert r.status_code == 201, r.text
            ledger.sent(r.json()["id"])

    # Then web 1 pushes each to bob's socket, once, and his acks make them read
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(ledger.received) < 3:
        time.sleep(0.05)
    time.sleep(1.0)
    agent.stop()
    assert not agent.errors, agent.errors
    assert ledger_problems(hub, ledger, end_states={"read"}) == []


def test_a_session_with_a_local_socket_gets_its_messages_written_by_the_worker(hub, tmp_path):
    from tests.integration.ledger import Ledger, SocketReceiver, ledger_problems, socket_path

    # Given bob listening on a Unix socket registered as his peer address
    ledger = Ledger()
    receiver = SocketReceiver(socket_path("sbp"), ledger)
    receiver.start()
    try:
        alice = hub.register("alice-uds", web=0)
        bob = hub.register("bob-uds", web=1, peer_address=receiver.address)

        # When alice sends him five messages
        with hub.client(0, headers=alice.headers) as c:
            for i in range(5):
                r = c.post("/api/v1/messages", json={"to": bob.ref, "message": f"by socket {i}"})
                assert r.status_code == 201, r.text
                ledger.sent(r.json()["id"])

        # Then the Celery worker writes each to his socket, once, and they become delivered
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            states = {
                s
                for (s,) in hub.sql(
                    "SELECT d.state FROM messaging_delivery d WHERE d.message_id = ANY(%s::uuid[])",
                    list(ledger.accepted),
                )
            }
            if states == {"delivered"}:
                break
            time.sleep(0.1)
        assert ledger_problems(hub, ledger, end_states={"delivered"}) == []
        assert all(f["marker"].startswith('[SWITCHBOARD FROM="alice-uds"') for f in receiver.frames)
    finally:
        receiver.stop()


def test_a_sender_hears_of_each_message_before_its_receipts(hub, tmp_path):
    """Across processes: the sender's socket (web 0) gets each message's `message.sent`, then its
    `delivered` (a pull on web 1, or the worker's socket write), then its `read` for an agent that
    acks, never one before another. The race this guards against needs a stalled sending thread
    and did not show here before the fix; `tests/messaging/test_event_order.py` checks the one
    hand-off that rules it out."""
    import json

    from websockets.sync.client import connect

    from tests.integration.ledger import Ledger, SocketReceiver, WebSocketAgent, socket_path

    to_socket, to_worker = Ledger(), Ledger()
    receiver = SocketReceiver(socket_path("sbo"), to_worker)
    receiver.start()
    alice = hub.register("alice-order", web=0)
    bob = hub.register("bob-order", web=1)  # on the agent socket of the other web; acks at once
    carol = hub.register("carol-order", web=1, peer_address=receiver.address)  # written by the worker
    agent = WebSocketAgent(hub.web_urls[1], bob, to_socket, deadline=60)
    agent.start()
    heard: list[tuple[str, str, str]] = []  # (message id, kind, state) in the order alice's socket got them
    try:
        assert agent.ready.wait(15) and not agent.errors, agent.errors
        url = hub.web_urls[0].replace("http://", "ws://") + "/ws/agent/"
        with connect(url, additional_headers=alice.headers, open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "hello"
            with hub.client(0, headers=alice.headers) as c:
                for i in range(18):  # 9 to each: within the per-pair rate (10 at once)
                    ledger, to = (to_worker, carol) if i % 2 else (to_socket, bob)
                    r = c.post("/api/v1/messages", json={"to": to.ref, "message": f"in order {i}"})
                    assert r.status_code == 201, r.text
                    ledger.sent(r.json()["id"])
            final = {
                **dict.fromkeys(to_socket.accepted, "read"),
                **dict.fromkeys(to_worker.accepted, "delivered"),
            }
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and {
                (m, "delivery.changed", s) for m, s in final.items()
            } - set(heard):
                try:
                    frame = json.loads(ws.recv(timeout=1))
                except TimeoutError:
                    continue
                if frame["type"] == "event" and frame["kind"] in ("message.sent", "delivery.changed"):
                    heard.append((frame["data"]["message_id"], frame["kind"], frame["data"]["state"]))
    finally:
        agent.stop()
        receiver.stop()

    assert not agent.errors, agent.errors
    for message_id, end in final.items():
        told = [(kind, state) for m, kind, state in heard if m == message_id]
        expected = [("message.sent", "queued"), ("delivery.changed", "delivered")]
        if end == "read":
            expected.append(("delivery.changed", "read"))
        assert told == expected, (message_id, told)


def test_the_worker_keeps_its_database_connection_from_task_to_task_and_replaces_a_broken_one(
    make_hub, fresh_database, private_redis
):
    """Beat has the worker run its periodic jobs (several a second here). Each task used to open a
    new PostgreSQL connection, a new backend process, because Celery's Django fixup closed it
    after every task; now the worker keeps it, and one that broke is replaced before the next task."""
    import psycopg

    hub = make_hub(database_url=fresh_database(), redis_url=private_redis.url(), webs=1)
    with psycopg.connect(hub.database_url, autocommit=True, connect_timeout=10) as conn:

        def sessions_so_far() -> int:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            return conn.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()[0]

        def others() -> set[int]:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
            return {pid for (pid,) in rows}

        # Given the periodic jobs running (the worker's log shows them)
        deadline = time.monotonic() + 20
        while "retry_socket_deliveries" not in hub.worker.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)

        # When six seconds of jobs go by, the database sees no new connection for them (but one:
        # the second pool process's first task may come only now)
        before = sessions_so_far()
        time.sleep(6)
        assert sessions_so_far() - before <= 1, "the worker opened a connection per task"

        # And when every idle connection to the database is cut (between two tasks: one cut in a
        # task's middle fails that task, as it should), the next tasks go on, on new ones
        cut_at = len(hub.worker.log())
        connected = {
            pid
            for (pid,) in conn.execute(
                "WITH idle AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE datname ="
                " current_database() AND pid <> pg_backend_pid() AND state = 'idle')"
                " SELECT pid FROM idle WHERE pg_terminate_backend(pid)"
            ).fetchall()
        }
        assert connected
        deadline = time.monotonic() + 20
        while not (others() - connected) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert others() - connected, "no task connected again after the cut"
        time.sleep(3)
        after_cut = hub.worker.log()[cut_at:]
        # A connection is idle between a task's statements too: the cut may fail a task it caught
        # mid-way (one per pool process at most); every task after those succeeds.
        failures = [line for line in after_cut.splitlines() if "raised unexpected" in line]
        assert len(failures) <= 2, after_cut[-2000:]
        # The cut's own error, as psycopg words it: the server's notice, or the connection found closed.
        assert all("raised unexpected: OperationalError(" in f for f in failures), failures
        since = after_cut.rsplit(failures[-1], 1)[1] if failures else after_cut
        assert since.count("retry_socket_deliveries") >= 2, since[-2000:]
        assert "ERROR" not in since, since[-2000:]


def test_at_the_default_log_level_the_worker_and_beat_say_nothing_of_routine_tasks(
    make_hub, fresh_database, private_redis
):
    """Beat sends its periodic jobs several times a second and the worker runs them; at the
    default SWITCHBOARD_TASK_LOG_LEVEL neither writes a line for it (it was six a second)."""
    hub = make_hub(
        database_url=fresh_database(),
        redis_url=private_redis.url(),
        webs=1,
        extra_env={"SWITCHBOARD_TASK_LOG_LEVEL": "WARNING"},
    )

    def commits() -> int:  # each job's statements commit: how the test sees them run
        return hub.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0]

    time.sleep(2)
    worker_lines, beat_lines = len(hub.worker.log().splitlines()), len(hub.beat.log().splitlines())
    before = commits()
    time.sleep(6)
    assert commits() - before >= 3, "the periodic jobs did not run"
    assert hub.worker.log().splitlines()[worker_lines:] == []
    assert hub.beat.log().splitlines()[beat_lines:] == []


def test_both_web_processes_write_when_their_callers_were_last_seen(hub):
    """A call notes its session's time and each web process's own thread writes the times, on a
    pooled connection, about a second later (messaging.services.seen)."""
    agents = [hub.register(f"seen-{i}", web=i % 2) for i in range(6)]
    ids = [a.id for a in agents]
    hub.sql(
        "UPDATE messaging_agentsession SET last_seen = now() - interval '1 hour' WHERE id = ANY(%s::uuid[])",
        ids,
    )

    def stale() -> set[str]:
        rows = hub.sql(
            "SELECT id::text FROM messaging_agentsession "
            "WHERE id = ANY(%s::uuid[]) AND last_seen < now() - interval '1 minute'",
            ids,
        )
        return {row[0].replace("-", "") for row in rows}

    stale_after_answer = 0
    for i, agent in enumerate(agents):
        with hub.client(i % 2, headers=agent.headers) as c:
            assert c.get("/api/v1/ping").status_code == 200
        stale_after_answer += agent.id.replace("-", "") in stale()
    # Written before the answer (as it was), none would be; a thread a second late leaves most.
    assert stale_after_answer >= 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and stale():
        time.sleep(0.1)
    assert stale() == set()
