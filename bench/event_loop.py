"""The web processes' event loop: uvloop (what `switchboard web` runs) against asyncio's own.

    .venv/bin/python bench/event_loop.py            # 6 latency rounds, 4 wrk rounds (~4 minutes)
    .venv/bin/python bench/event_loop.py --smoke    # one short round of each, to check it works

One hub (a fresh PostgreSQL database, a private Redis, a Celery worker and beat) with four web
processes: two on each loop. Machine speed drifts by more than the difference between the loops
from one minute to the next, so the two loops are measured on the same hub, minutes apart at most:

- send → push latency at 100 sends/s (as `send_path.py`: the sender posts to one web process of a
  pair, the timing agent listens on the other), the loops taking turns, in alternating order;
- web-process CPU per request under wrk (the no-op ping, then single sends, 4 connections), one
  process of each loop loaded at the same time, so both share whatever the machine does meanwhile.

Prints each round and the medians, with uvloop's ratio to asyncio (the baseline); writes
`bench/results/event_loop-<time>.json`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from common import cpu_seconds, line, progress, write_result, wrk_run
from harness import LOAD_ENV, PRODUCTION_SWEEP, production_hub, register
from send_path import push_latency

LOOPS = ("asyncio", "uvloop")  # the baseline first


def latency_rounds(urls: dict[str, tuple[str, str]], *, rounds: int, seconds: float) -> dict[str, list]:
    results: dict[str, list[dict[str, Any]]] = {loop: [] for loop in LOOPS}
    for r in range(rounds):
        for loop in LOOPS if r % 2 == 0 else LOOPS[::-1]:
            progress(f"round {r + 1}/{rounds}: send → push at 100/s on {loop}, {seconds:g} s")
            send_url, push_url = urls[loop]
            out = push_latency(send_url, push_url, rate=100, seconds=seconds, tag=f"{loop}-{r}")
            results[loop].append(out)
            line(f"  {loop}: p50 / p99", f"{out['p50_ms']:.2f} / {out['p99_ms']:.2f} ms")
    return results


def cpu_rounds(
    urls: dict[str, str], pids: dict[str, int], sink_ref: str, *, rounds: int, seconds: float
) -> dict[str, dict[str, list]]:
    results: dict[str, dict[str, list[dict[str, float]]]] = {loop: {"ping": [], "send": []} for loop in LOOPS}
    for r in range(rounds):
        senders = {loop: register(urls[loop], f"cpu-{loop}-{r}") for loop in LOOPS}
        for kind in ("ping", "send"):
            progress(f"round {r + 1}/{rounds}: wrk {kind} on both loops at once, {seconds:g} s")

            def load(loop: str, kind: str = kind, r: int = r, senders: dict = senders) -> dict[str, Any]:
                if kind == "ping":
                    request: dict[str, Any] = {"method": "GET", "path": "/api/v1/ping"}
                else:
                    body = json.dumps({"to": sink_ref, "message": f"loop {loop} {r} {{n}}"})
                    request = {"method": "POST", "path": "/api/v1/messages", "template": body}
                return wrk_run(
                    urls[loop], token=senders[loop].token, seconds=seconds, connections=4, **request
                )

            before = {loop: cpu_seconds([pids[loop]]) for loop in LOOPS}
            with concurrent.futures.ThreadPoolExecutor(len(LOOPS)) as pool:
                runs = dict(zip(LOOPS, pool.map(load, LOOPS), strict=True))
            for loop in LOOPS:
                cpu = cpu_seconds([pids[loop]]) - before[loop]
                run = runs[loop]
                if run["non_2xx"]:
                    raise RuntimeError(f"{loop}: {run['non_2xx']} answers not 2xx: {run['non_2xx_samples']}")
                figures = {
                    "per_s": run["requests_per_s"],
                    "cpu_ms_per_request": round(1000 * cpu / max(1, run["requests"]), 3),
                }
                results[loop][kind].append(figures)
                line(
                    f"  {loop} {kind}: rate, CPU per request",
                    f"{figures['per_s']:.0f}/s, {figures['cpu_ms_per_request']:.2f} ms",
                )
    return results


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="one 2 s round of each")
    parser.add_argument("--latency-rounds", type=int, default=6)
    parser.add_argument("--cpu-rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10, help="length of each latency run (wrk: half)")
    args = parser.parse_args()
    if args.smoke:
        args.latency_rounds, args.cpu_rounds, args.seconds = 1, 1, 2.0
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-loop-"))
    with production_hub(workdir, {**LOAD_ENV, **PRODUCTION_SWEEP}) as (hub, _db, _redis):
        # production_hub starts two web processes on the default loop (uvloop); add two on asyncio.
        pairs = {"uvloop": (hub.web_urls[0], hub.web_urls[1])}
        pids = {"uvloop": hub.webs[0].pid}
        hub.extra_env["SWITCHBOARD_EVENT_LOOP"] = "asyncio"
        pairs["asyncio"] = (hub.start_web(), hub.start_web())
        pids["asyncio"] = hub.webs[2].pid
        for web in hub.webs:
            wanted = "asyncio" if web in hub.webs[2:] else "uvloop"
            if f"daphne on the {wanted} event loop" not in web.log():
                raise RuntimeError(f"{web.name} is not on {wanted}:\n{web.log()[-1000:]}")
        latency = latency_rounds(pairs, rounds=args.latency_rounds, seconds=args.seconds)
        sink = register(pairs["asyncio"][1], "cpu-sink")
        cpu = cpu_rounds(
            {loop: pairs[loop][0] for loop in LOOPS},
            pids,
            sink.ref,
            rounds=args.cpu_rounds,
            seconds=args.seconds / 2,
        )
    summary: dict[str, dict[str, float]] = {}
    for loop in LOOPS:
        summary[loop] = {
            "latency_p50_ms": median([r["p50_ms"] for r in latency[loop]]),
            "latency_p99_ms": median([r["p99_ms"] for r in latency[loop]]),
            "post_p50_ms": median([r["post"]["p50_ms"] for r in latency[loop]]),
            "push_after_answer_p50_ms": median([r["push_after_answer"]["p50_ms"] for r in latency[loop]]),
            "cpu_ms_per_ping": median([r["cpu_ms_per_request"] for r in cpu[loop]["ping"]]),
            "cpu_ms_per_send": median([r["cpu_ms_per_request"] for r in cpu[loop]["send"]]),
        }
    lower = sum(u["p50_ms"] < a["p50_ms"] for u, a in zip(latency["uvloop"], latency["asyncio"], strict=True))
    print("\nmedians over the rounds (uvloop / asyncio = ratio to the baseline)")
    labels = {
        "latency_p50_ms": "send → push p50 at 100/s",
        "latency_p99_ms": "send → push p99 at 100/s",
        "post_p50_ms": "  the POST's answer, p50",
        "push_after_answer_p50_ms": "  then the push, p50",
        "cpu_ms_per_ping": "web CPU per no-op ping",
        "cpu_ms_per_send": "web CPU per single send",
    }
    for key, label in labels.items():
        a, u = summary["asyncio"][key], summary["uvloop"][key]
        line(label, f"{u:.2f} / {a:.2f} ms = {u / a:.2f}×")
    line("rounds with a lower p50 on uvloop", f"{lower} of {len(latency['uvloop'])}")
    write_result(
        "event_loop",
        {
            "args": vars(args),
            "summary": summary,
            "rounds_lower_on_uvloop": lower,
            "latency": latency,
            "cpu": cpu,
        },
    )


if __name__ == "__main__":
    main()
