"""Sends per second while retention purges N expired messages, against sends per second without.

    .venv/bin/python bench/purge.py               # 1,000,000 expired messages (setup takes minutes)
    .venv/bin/python bench/purge.py -n 200000
    .venv/bin/python bench/purge.py --smoke       # 20,000

On a fresh PostgreSQL database it writes N messages past retention, each with one read delivery,
starts one web process of the production topology (daphne, private Redis), and runs 8 senders
(8 sender→recipient pairs, each sending as fast as it is answered) for `--seconds` twice: first
with nothing else going on (the baseline), then while this process runs the retention purge
(`messaging.services.retention.retention_purge`, the periodic job's body) back to back. It prints
both rates, their ratio, the purge's rows per second, and the slowest send of each phase.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
from common import django_in_process, line, pct, progress, write_result
from harness import LOAD_ENV, RedisServer, database_drop, database_migrated, hub_start

SENDERS = 8
RETENTION_DAYS = 30


def make_expired(n: int) -> None:
    """N messages dated past retention, each with one read delivery, between two sessions."""
    from django.db import transaction
    from django.utils import timezone

    from messaging.models import Delivery, Message
    from messaging.services.sessions import session_register

    sender = session_register(name="old-sender").session
    recipient = session_register(name="old-recipient").session
    old = timezone.now() - timedelta(days=RETENTION_DAYS + 1)
    for start in range(0, n, 10_000):
        chunk = min(10_000, n - start)
        with transaction.atomic():
            messages = Message.objects.bulk_create(
                [
                    Message(sender=sender, text=f"old {start + i}", size=8, sha256=uuid.uuid4().hex * 2)
                    for i in range(chunk)
                ]
            )
            Message.objects.filter(pk__in=[m.pk for m in messages]).update(created_at=old)
            Delivery.objects.bulk_create(
                [Delivery(message=m, recipient=recipient, state="read", read_at=old) for m in messages]
            )
        if start and start % 100_000 == 0:
            progress(f"  {start:,} written")


def send_for(url: str, tokens: list[tuple[str, str]], seconds: float) -> tuple[int, list[float]]:
    """Each (token, recipient ref) pair sends for `seconds`; the sends answered 201 and every
    send's time."""
    count = 0
    spans: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def run(token: str, to: str) -> None:
        nonlocal count
        mine, times = 0, []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
            i = 0
            while time.monotonic() < stop_at and i < 1_000_000:
                t = time.perf_counter()
                r = c.post("/api/v1/messages", json={"to": to, "message": f"now {i}"})
                times.append(time.perf_counter() - t)
                mine += r.status_code == 201
                i += 1
        with lock:
            count += mine
            spans.extend(times)

    threads = [threading.Thread(target=run, args=pair) for pair in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count, spans


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("-n", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    n = 20_000 if args.smoke else args.n
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-purge-"))
    redis = RedisServer(workdir).start()
    db = database_migrated()
    hub = None
    try:
        django_in_process(
            database_url=db, redis_url=redis.url(), SWITCHBOARD_MESSAGE_RETENTION_DAYS=str(RETENTION_DAYS)
        )
        from django.db import connection

        from messaging.models import Message
        from messaging.services.retention import retention_purge

        progress(f"writing {n:,} expired messages with their deliveries")
        make_expired(n)
        with connection.cursor() as c:
            c.execute("ANALYZE")
        hub = hub_start(
            database_url=db,
            redis_url=redis.url(),
            workdir=workdir,
            webs=1,
            worker=False,
            beat=False,
            migrate=False,
            extra_env=LOAD_ENV,
        )
        url = hub.web_urls[0]
        pairs = []
        for i in range(SENDERS):
            hub.register(f"recipient-{i}")
            pairs.append((hub.register(f"sender-{i}").token, f"recipient-{i}"))

        progress(f"baseline: {SENDERS} senders for {args.seconds:.0f} s, nothing else running")
        base_count, base_spans = send_for(url, pairs, args.seconds)

        progress(f"purge: the same senders for {args.seconds:.0f} s while retention purges back to back")
        purged = {"messages": 0, "runs": 0, "seconds": 0.0}
        stop = threading.Event()

        def purge_loop() -> None:
            t = time.perf_counter()
            while not stop.is_set():
                done = retention_purge()
                purged["messages"] += done.messages
                purged["runs"] += 1
                if not done.messages:
                    break
            purged["seconds"] = time.perf_counter() - t

        purger = threading.Thread(target=purge_loop)
        purger.start()
        during_count, during_spans = send_for(url, pairs, args.seconds)
        stop.set()
        purger.join()
        left = Message.objects.filter(sender__name="old-sender").count()
        result = {
            "expired_messages": n,
            "senders": SENDERS,
            "seconds": args.seconds,
            "sends_per_s_without": round(base_count / args.seconds, 1),
            "sends_per_s_during_purge": round(during_count / args.seconds, 1),
            "ratio": round(during_count / base_count, 3) if base_count else None,
            "send_p99_ms_without": round(pct(base_spans, 99) * 1000, 1),
            "send_p99_ms_during_purge": round(pct(during_spans, 99) * 1000, 1),
            "send_max_ms_during_purge": round(max(during_spans) * 1000, 1),
            "purged_messages": purged["messages"],
            "purge_runs": purged["runs"],
            "purged_per_s": round(purged["messages"] / purged["seconds"], 1) if purged["seconds"] else None,
            "left_after": left,
        }
    finally:
        if hub:
            hub.stop()
        from django.db import connections

        connections.close_all()
        database_drop(db)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nSends while retention purges {n:,} expired messages (PostgreSQL, one web process)")
    line("sends/s without a purge", f"{result['sends_per_s_without']}")
    line("sends/s during the purge", f"{result['sends_per_s_during_purge']}", f"ratio {result['ratio']}")
    line(
        "send p99 without / during",
        f"{result['send_p99_ms_without']} / {result['send_p99_ms_during_purge']} ms",
    )
    line("slowest send during the purge", f"{result['send_max_ms_during_purge']} ms")
    line(
        "purged",
        f"{result['purged_messages']:,} in {result['purge_runs']} runs",
        f"{result['purged_per_s']}/s",
    )
    write_result("purge", result)


if __name__ == "__main__":
    main()
