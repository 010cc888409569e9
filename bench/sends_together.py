"""What sending a sender's concurrent single sends together saves, measured in-process.

    .venv/bin/python bench/sends_together.py            # about 2 minutes
    .venv/bin/python bench/sends_together.py --smoke    # a few seconds, to check it works

On a throwaway PostgreSQL database and a private Redis (the production stores), in this process:

- batch cost per message: `messages_send_batch` of 1, 3 and 10 plain texts to one recipient,
  against the baseline of a single `message_send` (CPU of the calling thread, then wall);
- sends together: T threads of one sender sending at once through `message_send_together`, the
  setting switched off (the baseline: each send alone) and on every round, alternating, so both
  see the same machine. CPU per send of this process (all its threads) and of every PostgreSQL
  process (from /proc), sends/s, and the ratio of on to off.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import cpu_seconds_named, django_in_process, line, progress, write_result
from harness import RedisServer, database_drop, database_migrated


def batch_costs(sender: Any, sizes: list[int], messages: int) -> dict[str, Any]:
    """CPU and wall per message of single sends and of batches of each size, after a warm-up."""
    from messaging.services.pipeline import message_send, messages_send_batch
    from messaging.services.request import SendRequest

    counter = iter(range(10**9))

    def texts(n: int) -> list[dict[str, str]]:
        return [{"to": "bench-sink", "text": f"batch cost {next(counter)}"} for _ in range(n)]

    def single() -> None:
        message_send(SendRequest(sender=sender, **texts(1)[0]))

    shapes: list[tuple[str, int, Callable[[], Any]]] = [("single", 1, single)]
    shapes += [
        (f"batch of {k}", k, lambda k=k: messages_send_batch(sender=sender, items=texts(k))) for k in sizes
    ]
    out = {}
    for name, size, call in shapes:
        progress(f"batch cost: {name}")
        for _ in range(max(20, messages // size // 5)):
            call()
        calls = max(1, messages // size)
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            call()
        out[name] = {
            "messages": calls * size,
            "cpu_ms_per_message": round((time.thread_time() - cpu) * 1000 / (calls * size), 3),
            "wall_ms_per_message": round((time.perf_counter() - wall) * 1000 / (calls * size), 3),
        }
    return out


def together_rounds(sender: Any, *, threads: int, per_thread: int, rounds: int) -> dict[str, Any]:
    """Rounds of `threads` threads sending `per_thread` each, the setting off then on (on then off
    in every other round)."""
    from django.conf import settings

    from messaging.principals import session_principal
    from messaging.services.request import SendRequest
    from messaging.services.together import message_send_together

    actor = session_principal(sender)
    stamp = iter(range(10**9))

    def work(_: int) -> None:
        for _ in range(per_thread):
            message_send_together(
                SendRequest(sender=sender, actor=actor, to="bench-sink", text=f"together {next(stamp)}")
            )

    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    kept = settings.SWITCHBOARD_SEND_TOGETHER
    try:
        with ThreadPoolExecutor(threads) as pool:  # its threads keep their connections to the end
            list(pool.map(work, range(threads)))  # warm-up: every thread connected, statements prepared
            for number in range(rounds):
                for mode in ("off", "on") if number % 2 == 0 else ("on", "off"):
                    progress(f"{threads} threads, round {number + 1}/{rounds}, sends together {mode}")
                    settings.SWITCHBOARD_SEND_TOGETHER = mode == "on"
                    cpu, pg, wall = time.process_time(), cpu_seconds_named("postgres"), time.perf_counter()
                    list(pool.map(work, range(threads)))
                    sends = threads * per_thread
                    runs[mode].append(
                        {
                            "python_cpu_ms_per_send": round((time.process_time() - cpu) * 1000 / sends, 3),
                            "postgres_cpu_ms_per_send": round(
                                (cpu_seconds_named("postgres") - pg) * 1000 / sends, 3
                            ),
                            "sends_per_s": round(sends / (time.perf_counter() - wall), 1),
                        }
                    )
    finally:
        settings.SWITCHBOARD_SEND_TOGETHER = kept
    return {"threads": threads, "per_thread": per_thread, **runs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="few sends: check that it runs")
    parser.add_argument("--threads", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each setting per thread count")
    parser.add_argument("--in-flight", type=int, default=None, help="groups of one sender running at once")
    args = parser.parse_args()
    messages, per_thread = (60, 10) if args.smoke else (1200, 100)
    rounds = 2 if args.smoke else args.rounds
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    redis = RedisServer(workdir).start()
    db = database_migrated()
    result: dict[str, Any] = {}
    try:
        django_in_process(database_url=db, redis_url=redis.url())
        from messaging.models import AgentSession
        from messaging.services import together
        from messaging.services.sessions import session_register

        if args.in_flight:
            together._together = together.SendsTogether(in_flight=args.in_flight)
        result["in_flight"] = together._together.in_flight

        sender = AgentSession.objects.get(pk=session_register(name="bench-sender").session.id)
        session_register(name="bench-sink")
        result["batch_costs"] = batch_costs(sender, [1, 3, 10], messages)
        result["together"] = [
            together_rounds(sender, threads=t, per_thread=per_thread, rounds=rounds) for t in args.threads
        ]
    finally:
        from django.db import connections

        connections.close_all()
        database_drop(db)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report(result)
    write_result("sends_together", result)


def _mean(runs: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def report(result: dict[str, Any]) -> None:
    print(
        f"\nSends together (in-process, PostgreSQL + Redis; {result['in_flight']} group(s) of a sender at once)"
    )
    costs = result["batch_costs"]
    base = costs["single"]["cpu_ms_per_message"]
    print(" cost per message, CPU / wall (ratio of CPU to a single send)")
    for name, c in costs.items():
        line(
            name,
            f"{c['cpu_ms_per_message']:.2f} / {c['wall_ms_per_message']:.2f} ms",
            f"{c['cpu_ms_per_message'] / base:.2f}×",
        )
    for t in result["together"]:
        print(f" {t['threads']} threads of one sender, {len(t['on'])} rounds of each setting (means)")
        for key, label in (
            ("python_cpu_ms_per_send", "this process's CPU per send"),
            ("postgres_cpu_ms_per_send", "PostgreSQL's CPU per send"),
            ("sends_per_s", "sends/s"),
        ):
            off, on = _mean(t["off"], key), _mean(t["on"], key)
            unit = "/s" if key == "sends_per_s" else " ms"
            line(f"  {label}, off → on", f"{off:.2f} → {on:.2f}{unit}", f"{on / off:.2f}×" if off else "")


if __name__ == "__main__":
    main()
