"""Record every operation of a fault test, then check the hub's books against the record.

`Ledger` keeps what each client saw: sends answered 2xx (accepted message ids), sends that failed,
and every message id a recipient received. `ledger_problems` then reads the database and returns a
list of sentences, one per broken promise (empty = the hub kept its word):

- every accepted message exists, with exactly one delivery, in one of the expected end states;
- nothing was received that was not accepted; nothing accepted and expected is missing;
- nothing was received twice unless the hub recorded a retry (attempts > 1 on the delivery);
- the audit has exactly one `message.accepted` per message, and the `delivery.<state>` events of
  each delivery form one unbroken chain from `accepted` to its current state (one event per change).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from hub_topology import LOAD_ENV, Hub, Registered

__all__ = ["LOAD_ENV"]  # the load tests take the lifted limits from here, with the ledger

STATES = {
    "accepted",
    "queued",
    "held",
    "delivered",
    "read",
    "refused",
    "denied",
    "expired",
    "failed",
    "relayed",
}


@dataclass
class Ledger:
    """What the clients saw, recorded as it happened (thread-safe)."""

    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    received: Counter = field(default_factory=Counter)
    received_at: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, message_id: str, **info: Any) -> None:
        with self.lock:
            self.accepted[message_id] = {"at": time.monotonic(), **info}

    def send_failed(self, **info: Any) -> None:
        with self.lock:
            self.failed.append(info)

    def got(self, message_id: str) -> None:
        with self.lock:
            self.received[message_id] += 1
            self.received_at.setdefault(message_id, time.monotonic())


def ledger_problems(
    hub: Hub,
    ledger: Ledger,
    *,
    end_states: set[str],
    expect_received: bool = True,
) -> list[str]:
    """Everything the database and audit say that contradicts the ledger (see the module docstring)."""
    problems: list[str] = []
    ids = list(ledger.accepted)
    if not ids:
        return ["no message was accepted at all"]
    rows = hub.sql(
        "SELECT m.id::text, d.id, d.state, d.attempts FROM messaging_message m "
        "LEFT JOIN messaging_delivery d ON d.message_id = m.id WHERE m.id = ANY(%s::uuid[])",
        ids,
    )
    by_message: dict[str, list[tuple]] = {}
    for mid, did, state, attempts in rows:
        by_message.setdefault(mid, []).append((did, state, attempts))
    for mid in ids:
        found = by_message.get(mid, [])
        if not found:
            problems.append(f"accepted message {mid} is not in the database")
        elif len(found) != 1 or found[0][0] is None:
            problems.append(f"message {mid} has {len(found)} deliveries, expected 1")
        elif found[0][1] not in end_states:
            problems.append(f"message {mid} ended in {found[0][1]!r}, expected one of {sorted(end_states)}")
    unknown = set(ledger.received) - set(ids)
    if unknown:
        problems.append(f"{len(unknown)} messages were received that no send accepted: {sorted(unknown)[:3]}")
    if expect_received:
        missing = [mid for mid in ids if ledger.received[mid] == 0]
        if missing:
            problems.append(f"{len(missing)} accepted messages never reached their recipient: {missing[:3]}")
    attempts = {mid: (found[0][2] or 0) for mid, found in by_message.items() if found and found[0][0]}
    for mid, count in ledger.received.items():
        if count > 1 and attempts.get(mid, 0) < count:
            problems.append(
                f"message {mid} was received {count} times with {attempts.get(mid, 0)} recorded attempts"
            )

    accepted_events = Counter(
        mid
        for (mid,) in hub.sql(
            "SELECT message_id::text FROM messaging_auditevent WHERE kind = 'message.accepted' "
            "AND message_id = ANY(%s::uuid[])",
            ids,
        )
    )
    for mid in ids:
        if accepted_events[mid] != 1:
            problems.append(
                f"message {mid} has {accepted_events[mid]} message.accepted audit events, expected 1"
            )
    delivery_ids = [found[0][0] for found in by_message.values() if found and found[0][0] is not None]
    current = {found[0][0]: found[0][1] for found in by_message.values() if found and found[0][0] is not None}
    chains: dict[int, list[tuple[str, str]]] = {}
    for did, kind, source in hub.sql(
        "SELECT delivery_id, kind, detail->>'from' FROM messaging_auditevent "
        "WHERE kind LIKE 'delivery.%%' AND delivery_id = ANY(%s) ORDER BY id",
        delivery_ids,
    ):
        state = kind.split(".", 1)[1]
        if state in STATES:
            chains.setdefault(did, []).append((source, state))
    for did in delivery_ids:
        chain = chains.get(did, [])
        at = "accepted"
        for source, state in chain:
            if source != at:
                problems.append(f"delivery {did}: audit says {source}→{state} but it was {at}: {chain}")
                break
            at = state
        else:
            if at != current[did]:
                problems.append(
                    f"delivery {did} is {current[did]!r} but its audit chain ends at {at!r}: {chain}"
                )
    return problems


class InboxReader(threading.Thread):
    """An agent that long-polls its inbox on one web process, records what arrives and acks it."""

    def __init__(
        self, base_url: str, agent: Registered, ledger: Ledger, *, wait: float = 4, deadline: float = 120
    ):
        super().__init__(daemon=True, name=f"inbox-{agent.name}")
        self.base_url, self.agent, self.ledger, self.wait = base_url, agent, ledger, wait
        self.stop_at = time.monotonic() + deadline
        self.halt = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        # As the agent client does (HubClient.inbox): a pull whose answer was lost may still have
        # handed messages over (the database failed while committing), so the next pull asks for
        # delivered-but-unacked messages too, and counts only ids it has not seen.
        unsettled = False
        with httpx.Client(base_url=self.base_url, headers=self.agent.headers, timeout=self.wait + 30) as c:
            while not self.halt.is_set() and time.monotonic() < self.stop_at:
                try:
                    params: dict[str, Any] = {"wait": self.wait}
                    if unsettled:
                        params["include_unacked"] = "true"
                    try:
                        r = c.get("/api/v1/inbox", params=params)
                    except httpx.HTTPError:
                        unsettled = True
                        raise
                    if r.status_code != 200:
                        unsettled = unsettled or r.status_code >= 500
                        self.errors.append(f"{r.status_code}: {r.text[:200]}")
                        time.sleep(0.2)
                        continue
                    ids = [m["id"] for m in r.json()["messages"]]
                    for mid in ids:
                        if not unsettled or self.ledger.received[mid] == 0:
                            self.ledger.got(mid)
                    unsettled = False
                    if ids:
                        a = c.post("/api/v1/inbox/ack", json={"ids": ids})
                        if a.status_code != 200:
                            self.errors.append(f"ack {a.status_code}: {a.text[:200]}")
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                    time.sleep(0.2)
            if not self.halt.is_set():
                self.errors.append("the reader ran out of time before it was stopped")

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=self.wait + 35)

    def drain(self) -> None:
        """After stopping: fetch what was handed over but never acked (a reply lost mid-fault),
        counting only ids this reader has not seen, then ack everything."""
        with httpx.Client(base_url=self.base_url, headers=self.agent.headers, timeout=30) as c:
            for _ in range(50):
                r = c.get("/api/v1/inbox", params={"include_unacked": "true", "limit": 1000})
                r.raise_for_status()
                ids = [m["id"] for m in r.json()["messages"]]
                if not ids:
                    return
                for mid in ids:
                    if self.ledger.received[mid] == 0:
                        self.ledger.got(mid)
                c.post("/api/v1/inbox/ack", json={"ids": ids}).raise_for_status()


class SendLoad(threading.Thread):
    """A sender that sends unique texts with unique idempotency keys to `to`, recording each try.

    `attempts` keeps (key, status or error, monotonic time) for every try; 2xx go to the ledger."""

    def __init__(
        self,
        base_url: str,
        sender: Registered,
        to: str,
        ledger: Ledger,
        *,
        count: int,
        interval: float = 0.0,
        tag: str = "",
        deadline: float = 120,
    ):
        super().__init__(daemon=True, name=f"send-{sender.name}{tag}")
        self.base_url, self.sender, self.to, self.ledger = base_url, sender, to, ledger
        self.count, self.interval, self.tag = count, interval, tag or sender.name
        self.stop_at = time.monotonic() + deadline
        self.halt = threading.Event()
        self.attempts: list[tuple[str, int | str, float]] = []
        self.spans: list[tuple[float, float, int | str]] = []  # (started, answered, outcome)

    def body(self, i: int) -> dict[str, Any]:
        return {"to": self.to, "message": f"load {self.tag} #{i}", "idempotency_key": f"{self.tag}-{i}"}

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.sender.headers, timeout=30) as c:
            for i in range(self.count):
                if self.halt.is_set() or time.monotonic() > self.stop_at:
                    return
                self.send_one(c, i)
                if self.interval:
                    time.sleep(self.interval)

    def send_one(self, c: httpx.Client, i: int) -> int | str:
        body = self.body(i)
        started = time.monotonic()
        try:
            r = c.post("/api/v1/messages", json=body)
            outcome: int | str = r.status_code
            if 200 <= r.status_code < 300:
                self.ledger.sent(r.json()["id"], key=body["idempotency_key"], status=r.json()["status"])
            else:
                self.ledger.send_failed(key=body["idempotency_key"], status=r.status_code, body=r.text[:300])
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
            self.ledger.send_failed(key=body["idempotency_key"], status=outcome)
        self.attempts.append((body["idempotency_key"], outcome, time.monotonic()))
        self.spans.append((started, time.monotonic(), outcome))
        return outcome

    def resend_failed(self, *, tries: int = 20) -> list[str]:
        """Retry every key whose last try did not succeed (same key, same text) until it does;
        return the keys that still failed after `tries` rounds."""
        last: dict[str, int | str] = {}
        index: dict[str, int] = {}
        for key, outcome, _ in self.attempts:
            last[key] = outcome
            index[key] = int(key.rsplit("-", 1)[1])
        pending = [k for k, o in last.items() if not (isinstance(o, int) and 200 <= o < 300)]
        with httpx.Client(base_url=self.base_url, headers=self.sender.headers, timeout=30) as c:
            for _ in range(tries):
                if not pending:
                    break
                still = []
                for key in pending:
                    outcome = self.send_one(c, index[key])
                    if not (isinstance(outcome, int) and 200 <= outcome < 300):
                        still.append(key)
                pending = still
                if pending:
                    time.sleep(0.5)
        return pending


def socket_path(tag: str) -> str:
    """A path for a test's socket listener, short (Unix socket names are limited) and its own:
    two runs of the suite at once (or two tests of one name) never bind the same one."""
    import secrets

    return f"/tmp/{tag}-{secrets.token_hex(5)}.sock"


class SocketReceiver(threading.Thread):
    """A session's local socket listener (the `uds:` transport): reads one JSON frame per
    connection, records its id and answers `{"ack": id}`. With `stall=True` it accepts connections
    and never reads them (a receiver that stopped reading)."""

    def __init__(self, path: str, ledger: Ledger, *, stall: bool = False):
        super().__init__(daemon=True, name=f"uds-{path}")
        import socket as socket_module

        self.path, self.ledger, self.stall = path, ledger, stall
        self.server = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(512)
        self.server.settimeout(0.2)
        self.halt = threading.Event()
        self.frames: list[dict[str, Any]] = []
        self.stalled: list[Any] = []

    @property
    def address(self) -> str:
        return f"uds:{self.path}"

    def run(self) -> None:
        import json

        while not self.halt.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.stall:
                self.stalled.append(conn)  # keep it open, never read
                continue
            try:
                conn.settimeout(5)
                data = b""
                while not data.endswith(b"\n") and len(data) < 32 * 1024 * 1024:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                frame = json.loads(data)
                self.frames.append(frame)
                self.ledger.got(frame["id"])
                conn.sendall(json.dumps({"ack": frame["id"]}).encode() + b"\n")
            except (OSError, ValueError):
                pass
            finally:
                conn.close()

    def stop(self) -> None:
        import os

        self.halt.set()
        self.join(timeout=5)
        self.server.close()
        for conn in self.stalled:
            conn.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class WebSocketAgent(threading.Thread):
    """An agent on the agent WebSocket `/ws/agent/`: records each pushed message and acks it."""

    def __init__(self, base_url: str, agent: Registered, ledger: Ledger, *, deadline: float = 120):
        super().__init__(daemon=True, name=f"ws-{agent.name}")
        self.url = base_url.replace("http://", "ws://") + "/ws/agent/"
        self.agent, self.ledger = agent, ledger
        self.stop_at = time.monotonic() + deadline
        self.halt = threading.Event()
        self.ready = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        import json

        from websockets.sync.client import connect

        try:
            with connect(self.url, additional_headers=self.agent.headers, open_timeout=10) as ws:
                while not self.halt.is_set() and time.monotonic() < self.stop_at:
                    try:
                        raw = ws.recv(timeout=0.2)
                    except TimeoutError:
                        continue
                    frame = json.loads(raw)
                    if frame["type"] == "hello":
                        self.ready.set()
                    elif frame["type"] == "messages":
                        ids = [m["id"] for m in frame["messages"]]
                        for mid in ids:
                            self.ledger.got(mid)
                        ws.send(json.dumps({"type": "ack", "ids": ids}))
                    elif frame["type"] == "error":
                        self.errors.append(str(frame))
        except Exception as exc:  # recorded for the test to assert on
            self.errors.append(repr(exc))
        finally:
            self.ready.set()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def stalled_websocket(base_url: str, agent: Registered) -> Any:
    """Open the agent WebSocket with a tiny receive buffer, complete the handshake, and return the
    raw socket: the caller never reads from it again (a client that stopped reading)."""
    import base64
    import os
    import socket as socket_module

    host, port = base_url.removeprefix("http://").split(":")
    sock = socket_module.socket()
    sock.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/agent/ HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {agent.token}\r\n\r\n"
        ).encode()
    )
    head = sock.recv(1024)
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    return sock
