"""Cost of a send and of an inbox read with 10, 10,000 and 100,000 messages already in the inbox,
against a file mailbox at the same sizes, and with as many exited sessions on the hub.

    .venv/bin/python bench/inbox_scaling.py           # about 2 minutes
    .venv/bin/python bench/inbox_scaling.py --smoke   # sizes 10 and 1,000 only

The hub side calls the services in this process (`message_send`, `inbox_pull` + `inbox_ack`) on a
fresh PostgreSQL database, so HTTP costs (constant per request) do not blur the trend. Four hub
shapes are measured:
  - unread: the N messages are queued and unread (what a file mailbox holds: delivered entries are
    removed from it), with the unread cap lifted so such an inbox can exist;
  - history: the N messages were read long ago (the hub keeps them; a file mailbox would not).
  - sender: the N messages are the sender's own, sent within the last half minute to someone else
    (inside the dedupe and loop windows): a busy sender's send must not slow down either;
  - recipient: the N messages are the recipient's own, sent within the last half minute to someone
    else, and the sender has read N from that someone: the loop rule counts the recipient's texts
    to the sender, and must read neither side's other traffic.
A fifth measures what a hub accumulates besides messages: sessions. Every agent session it ever
registered stays (exited), and a folder's sessions share the folder's name:
  - sessions: a send by name with N exited sessions on the hub, half of them named like the
    recipient. The table is the hub's, not a pair's, so the sizes are visited in turn by growing
    it (10, 10,000, 100,000) and shrinking it again, half the rounds each way.
The file-mailbox baseline is the design reference's: one JSON array per recipient, a lock file,
the whole array read, changed and rewritten atomically (temp file, fsync, rename) on every
write and on every read that marks messages read.

One operation = one send of a new message; one read = pull what is queued (at most 10) and ack it.
The sizes are measured in turn, round by round, not one after the other, so the machine's own
swings during the run fall on every size alike.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import django_in_process, line, progress, summary_ms, write_result
from harness import database_drop, database_migrated


class FileMailbox:
    """One recipient's inbox as a locked JSON array, rewritten atomically on every change."""

    def __init__(self, folder: Path, recipient: str):
        self.path = folder / f"{recipient}.json"
        self.lock = folder / f"{recipient}.json.lock"
        self.path.write_text("[]")

    def _rewrite(self, entries: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(entries, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def preload(self, n: int) -> None:
        self._rewrite([self._entry(i) for i in range(n)])

    @staticmethod
    def _entry(i: int) -> dict[str, Any]:
        return {
            "id": str(uuid.uuid4()),
            "from": "alice",
            "text": f"history message {i} " + "x" * 120,
            "summary": "",
            "timestamp": "2026-11-29T00:00:00Z",
            "read": False,
        }

    def send(self, text: str) -> None:
        with open(self.lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = json.loads(self.path.read_text())
            entries.append({**self._entry(0), "text": text})
            self._rewrite(entries)

    def read(self, limit: int = 10) -> list[dict[str, Any]]:
        """The oldest unread entries; delivered ones are removed (as the reference does)."""
        with open(self.lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = json.loads(self.path.read_text())
            taken = entries[:limit]
            self._rewrite(entries[limit:])
            return taken


def file_costs(sizes: list[int], rounds: int) -> dict[int, dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="sb-bench-mailbox-"))
    try:
        progress(f"file mailbox baseline: {len(sizes)} sizes, {rounds} rounds")
        boxes = {n: FileMailbox(folder, f"bob{n}") for n in sizes}
        for n, box in boxes.items():
            box.preload(n)
        costs: dict[int, dict[str, list[float]]] = {n: {"send": [], "read": []} for n in sizes}
        for i in range(rounds):  # the sizes in turn, as for the hub (`hub_costs`)
            for n, box in boxes.items():
                if n > 10_000 and i >= max(3, rounds // 5):  # a rewrite of 100,000 entries is slow
                    continue
                t = time.perf_counter()
                box.send(f"new {i}")
                costs[n]["send"].append(time.perf_counter() - t)
                t = time.perf_counter()
                box.read(limit=1)  # keeps the size at n
                costs[n]["read"].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {n: {op: summary_ms(times) for op, times in ops.items()} for n, ops in costs.items()}


def database_settle(connection: Any) -> None:
    """Let PostgreSQL digest what was just written before measuring, the same way at every size:
    VACUUM (ANALYZE) clears the dead tuples of the bulk update and refreshes the statistics and
    the visibility map (so autovacuum does not start during the rounds), and CHECKPOINT writes the
    dirty pages out now rather than while the rounds run. Database-wide, so no table the send or
    the read touches is missed; VACUUM cannot run in a transaction, so this runs in autocommit."""
    with connection.cursor() as c:
        c.execute("VACUUM (ANALYZE)")
        c.execute("CHECKPOINT")


def hub_costs(sizes: list[int], rounds: int, shape: str) -> dict[int, dict[str, Any]]:
    """Each size gets its own sender and recipient, filled first; then the rounds visit the sizes
    in turn (send, then read, at 10, then at 10,000, ...), so a machine that speeds up or slows
    down during the run (a shared one does, by up to 1.5× within minutes) moves every size alike
    and the ratios between them stay about the code."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from messaging.models import AgentSession, Delivery, Message
    from messaging.principals import session_principal
    from messaging.services.delivery import inbox_ack, inbox_pull
    from messaging.services.pair import dedupe_key, pair_key
    from messaging.services.pipeline import message_send
    from messaging.services.request import SendRequest
    from messaging.services.sessions import session_register

    long_ago = timezone.now() - timedelta(days=2)
    recently = timezone.now() - timedelta(seconds=30)  # inside every dedupe and loop window

    def fill(author: AgentSession, inbox: AgentSession, n: int, *, state: str, created_at: Any) -> None:
        for start in range(0, n, 5000):
            chunk = min(5000, n - start)
            hashes = [uuid.uuid4().hex * 2 for _ in range(chunk)]
            messages = Message.objects.bulk_create(
                [
                    Message(
                        sender=author,
                        text=f"history {start + i} " + "x" * 120,
                        size=140,
                        sha256=sha256,
                        dedupe_key=dedupe_key(author.id, sha256),
                        pair_key=pair_key(author.id, inbox.id),
                        request_hash="",
                    )
                    for i, sha256 in enumerate(hashes)
                ]
            )
            Delivery.objects.bulk_create(
                [
                    Delivery(
                        message=m,
                        recipient=inbox,
                        state=state,
                        queued_at=long_ago,
                        delivered_at=None if state == "queued" else long_ago,
                        read_at=None if state == "queued" else long_ago,
                    )
                    for m in messages
                ]
            )
        # Set apart: a new row takes the time it is written (`auto_now_add`). Found by the pair key
        # (one index range): asked for by sender and recipient, a prepared UPDATE could keep a
        # generic plan that joined every delivery per message, and ran for minutes.
        Message.objects.filter(pair_key=pair_key(author.id, inbox.id)).update(created_at=created_at)

    pairs = {}
    for n in sizes:
        progress(f"{shape}: filling a {n:,}-message inbox")
        alice = session_register(name=f"alice-{shape}-{n}").session
        bob = session_register(name=f"bob-{shape}-{n}").session
        carol = session_register(name=f"carol-{shape}-{n}").session
        with transaction.atomic():
            if shape == "sender":  # alice's own, to carol, just now
                fill(alice, carol, n, state="queued", created_at=recently)
            elif shape == "recipient":  # bob's own to carol just now, and alice's inbox from carol
                fill(bob, carol, n, state="queued", created_at=recently)
                fill(carol, alice, n, state="read", created_at=long_ago)
            else:  # bob's inbox, from alice, unread or read long ago
                fill(alice, bob, n, state="read" if shape == "history" else "queued", created_at=long_ago)
        pairs[n] = (alice, bob, session_principal(bob))
    database_settle(connection)
    AgentSession.objects.filter(pk__in=[bob.pk for _, bob, _ in pairs.values()]).update(
        last_seen=timezone.now()
    )
    costs: dict[int, dict[str, list[float]]] = {n: {"send": [], "read": []} for n in sizes}
    progress(f"{shape}: {rounds} rounds of a send and a read at each size")
    for i in range(rounds):
        for n, (alice, bob, actor) in pairs.items():
            t = time.perf_counter()
            sent = message_send(SendRequest(sender=alice, to=bob.ref, text=f"new {shape} {n} {i}"))
            costs[n]["send"].append(time.perf_counter() - t)
            t = time.perf_counter()
            if shape == "unread":  # (the sender and recipient shapes' inboxes hold only these sends)
                # Read the oldest one (keeps n unread), as the file mailbox does.
                got = inbox_pull(recipient=bob, actor=actor, limit=1)
            else:
                got = inbox_pull(recipient=bob, actor=actor, limit=10)
            inbox_ack(recipient=bob, actor=actor, message_ids=[str(d.message_id) for d in got])
            costs[n]["read"].append(time.perf_counter() - t)
            assert got, "the read found nothing"
            assert sent.status == "queued"
    return {n: {op: summary_ms(times) for op, times in ops.items()} for n, ops in costs.items()}


def session_costs(sizes: list[int], rounds: int) -> dict[int, dict[str, Any]]:
    """A send by name (and an inbox read) with N exited sessions on the hub, half of them named like
    the recipient: up through the sizes and back down, `rounds // 2` rounds at each visit."""
    from django.db import connection

    from hub_fixtures.history import exited_sessions_made
    from messaging.models import AgentSession
    from messaging.principals import session_principal
    from messaging.services.delivery import inbox_ack, inbox_pull
    from messaging.services.pipeline import message_send
    from messaging.services.request import SendRequest
    from messaging.services.sessions import session_register

    alice = session_register(name="alice-sessions").session
    bob = session_register(name="bob-sessions").session
    actor = session_principal(bob)
    seen: list[str] = []  # the exited sessions' ids, oldest first

    def resize(n: int) -> None:
        if n < len(seen):
            drop, seen[n:] = seen[n:], []
            for start in range(0, len(drop), 5000):
                AgentSession.objects.filter(pk__in=drop[start : start + 5000]).delete()
        while len(seen) < n:
            names = [
                bob.name if (len(seen) + i) % 2 else f"agent-{secrets.token_hex(4)}" for i in range(5000)
            ]
            made = exited_sessions_made(names[: n - len(seen)])
            seen.extend(str(m.pk) for m in made)
        database_settle(connection)

    costs: dict[int, dict[str, list[float]]] = {n: {"send": [], "read": []} for n in sizes}
    visits = [*sizes, *reversed(sizes[:-1])]
    for k, n in enumerate(visits):
        progress(f"sessions: {n:,} exited sessions on the hub ({k + 1} of {len(visits)})")
        resize(n)
        for i in range(max(1, rounds // 2)):
            t = time.perf_counter()
            sent = message_send(SendRequest(sender=alice, to=bob.name, text=f"new sessions {n} {k} {i}"))
            costs[n]["send"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = inbox_pull(recipient=bob, actor=actor, limit=10)
            inbox_ack(recipient=bob, actor=actor, message_ids=[str(d.message_id) for d in got])
            costs[n]["read"].append(time.perf_counter() - t)
            assert got and sent.recipient.id == bob.id
    resize(0)
    return {n: {op: summary_ms(times) for op, times in ops.items()} for n, ops in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    sizes = [10, 1_000] if args.smoke else [10, 10_000, 100_000]
    rounds = 20 if args.smoke else args.rounds
    db = database_migrated()
    try:
        django_in_process(database_url=db)
        result: dict[str, Any] = {"sizes": sizes, "rounds": rounds}
        result["hub_unread"] = hub_costs(sizes, rounds, "unread")
        result["hub_history"] = hub_costs(sizes, rounds, "history")
        result["hub_sender"] = hub_costs(sizes, rounds, "sender")
        result["hub_recipient"] = hub_costs(sizes, rounds, "recipient")
        result["hub_sessions"] = session_costs(sizes, rounds)
        result["file_mailbox"] = file_costs(sizes, rounds)
    finally:
        from django.db import connections

        connections.close_all()
        database_drop(db)
    report(result)
    write_result("inbox_scaling", result)


def report(result: dict[str, Any]) -> None:
    sizes = result["sizes"]
    small, big = sizes[0], sizes[-1]
    print(
        "\nSend and inbox read, p50 in ms, by messages already in the inbox (or exited sessions on the hub)"
    )
    print(f"  {'':<32}" + "".join(f"{n:>12,}" for n in sizes) + f"{'big/small':>12}")
    for key, label in (
        ("hub_unread", "hub, N unread"),
        ("hub_history", "hub, N read (history)"),
        ("hub_sender", "hub, N sent by the sender"),
        ("hub_recipient", "hub, N sent by the recipient"),
        ("hub_sessions", "hub, N exited sessions"),
        ("file_mailbox", "file mailbox"),
    ):
        for op in ("send", "read"):
            row = result[key]
            values = [row[n][op]["p50_ms"] for n in sizes]
            ratio = values[-1] / values[0]
            print(f"  {label + ' ' + op:<32}" + "".join(f"{v:>12.3f}" for v in values) + f"{ratio:>11.2f}×")
    print()
    for key in ("hub_unread", "hub_history", "hub_sender", "hub_recipient", "hub_sessions"):
        for op in ("send", "read"):
            ratio = result[key][big][op]["p50_ms"] / result[key][small][op]["p50_ms"]
            line(f"{key} {op} at {big:,} vs {small}", f"{ratio:.2f}×", "target ≤ 1.2×")
        vs_file = result["file_mailbox"][big]["send"]["p50_ms"] / result[key][big]["send"]["p50_ms"]
        line(f"file mailbox send / {key} send at {big:,}", f"{vs_file:.1f}×")


if __name__ == "__main__":
    main()
