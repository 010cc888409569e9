"""1,000 agent WebSockets connected, one message per second each: push latency p50/p99 and memory.

    .venv/bin/python bench/websockets_1000.py              # 1,000 sockets, 20 s of load (~2 min)
    .venv/bin/python bench/websockets_1000.py --smoke      # 50 sockets, 5 s

Production topology (two daphne web processes, worker, beat, PostgreSQL, a private Redis). The
sockets are split over both web processes and driven from one asyncio client process; a sender
posts batches (`POST /api/v1/messages/batch`, 100 messages to 100 different agents, every 100 ms,
alternating web processes) so that each agent is offered one message per second. Each message
carries its send time; latency is from the start of its batch request to its push arriving.
Baseline in the same run: the same number of idle sockets (memory) and the web processes' memory
before any socket connected.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import add_event_loop_option, line, progress, summary_ms, write_result
from harness import (
    LOAD_ENV,
    PRODUCTION_SWEEP,
    RedisServer,
    database_drop,
    database_migrated,
    hub_start,
    register,
    rss_mb,
)


async def agent(
    url: str,
    token: str,
    latencies: list[float],
    ready: asyncio.Event,
    counter: list[int],
    stop: asyncio.Event,
) -> None:
    from websockets.asyncio.client import connect

    async with connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=60, max_queue=64
    ) as ws:
        counter[0] += 1
        if counter[0] >= counter[1]:
            ready.set()
        while not stop.is_set():
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
            except TimeoutError:
                continue
            now = time.time()
            frame = json.loads(raw)
            if frame["type"] == "messages":
                ids = []
                for m in frame["messages"]:
                    sent = float(m["text"].split(" ", 2)[1])
                    latencies.append(now - sent)
                    ids.append(m["id"])
                await ws.send(json.dumps({"type": "ack", "ids": ids}))


async def drive(
    urls: list[str], agents: list[Any], sender_tokens: list[str], *, seconds: float
) -> dict[str, Any]:
    latencies: list[float] = []
    ready, stop = asyncio.Event(), asyncio.Event()
    counter = [0, len(agents)]
    tasks = [
        asyncio.create_task(
            agent(
                urls[i % len(urls)].replace("http://", "ws://") + "/ws/agent/",
                a.token,
                latencies,
                ready,
                counter,
                stop,
            )
        )
        for i, a in enumerate(agents)
    ]
    t = time.perf_counter()
    await asyncio.wait_for(ready.wait(), timeout=120)
    connect_s = time.perf_counter() - t
    await asyncio.sleep(2)
    sent = 0
    failures: list[str] = []
    batch = min(100, len(agents))
    ticks = int(seconds * 10)
    per_tick = len(agents) / 10  # each agent gets one message a second
    clients = [
        httpx.AsyncClient(base_url=u, headers={"Authorization": f"Bearer {tok}"}, timeout=60)
        for u, tok in zip(urls, sender_tokens, strict=True)
    ]
    begin = time.perf_counter()
    cursor = 0
    pending: set[asyncio.Task] = set()

    async def post(client: httpx.AsyncClient, body: dict) -> None:
        nonlocal sent
        r = await client.post("/api/v1/messages/batch", json=body)
        if r.status_code != 201:
            failures.append(f"{r.status_code} {r.text[:120]}")
        else:
            sent += r.json()["accepted"]

    owed = 0.0
    for tick in range(ticks):
        await asyncio.sleep(max(0.0, begin + tick / 10 - time.perf_counter()))
        owed += per_tick
        while owed >= 1:
            n = int(min(batch, owed))
            owed -= n
            stamp = time.time()
            msgs = []
            for _ in range(n):
                a = agents[cursor % len(agents)]
                cursor += 1
                msgs.append({"to": a.ref, "message": f"t {stamp:.6f} {cursor}"})
            task = asyncio.create_task(post(clients[tick % len(clients)], {"messages": msgs}))
            pending.add(task)
            task.add_done_callback(pending.discard)
    offered_s = time.perf_counter() - begin
    if pending:
        await asyncio.wait(pending, timeout=60)
    drain_until = time.perf_counter() + 20
    while len(latencies) < sent and time.perf_counter() < drain_until:
        await asyncio.sleep(0.2)
    elapsed = time.perf_counter() - begin
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in clients:
        await c.aclose()
    return {
        "sockets": len(agents),
        "connect_s": round(connect_s, 2),
        "offered_per_s": round(cursor / offered_s, 1),
        "accepted": sent,
        "pushed": len(latencies),
        "elapsed_s": round(elapsed, 2),
        "failures": failures[:5],
        "failed_batches": len(failures),
        "latency": summary_ms(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    add_event_loop_option(parser, processes="the web processes'")
    args = parser.parse_args()
    if args.smoke:
        args.sockets, args.seconds = 50, 5
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-ws-"))
    redis = RedisServer(workdir).start()
    db = database_migrated()
    hub = None
    try:
        progress("starting the production topology")
        hub = hub_start(
            database_url=db,
            redis_url=redis.url(),
            workdir=workdir / "hub",
            migrate=False,
            extra_env={**LOAD_ENV, **PRODUCTION_SWEEP, "SWITCHBOARD_EVENT_LOOP": args.event_loop},
        )
        progress(f"registering {args.sockets:,} agents")
        before = {p.name: round(rss_mb(p.pid), 1) for p in hub.webs}
        senders = [register(u, f"ws-sender-{i}") for i, u in enumerate(hub.web_urls)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            agents = list(
                pool.map(lambda i: register(hub.web_urls[i % 2], f"ws-agent-{i}"), range(args.sockets))
            )

        async def run() -> dict[str, Any]:
            return await drive(hub.web_urls, agents, [s.token for s in senders], seconds=args.seconds)

        progress(f"{args.sockets:,} sockets: connecting, then {args.seconds:g} s at 1 message/s each")
        result = asyncio.run(run())
        after = {p.name: round(rss_mb(p.pid), 1) for p in hub.webs}
        result["web_rss_mb_before"] = before
        result["web_rss_mb_after"] = after
        result["event_loop"] = args.event_loop
    finally:
        if hub:
            hub.stop()
        redis.stop()
        database_drop(db)
        shutil.rmtree(workdir, ignore_errors=True)
    lat = result["latency"]
    print(f"\n{result['sockets']:,} agent WebSockets, one message per second each")
    line("connected in", f"{result['connect_s']:.1f} s")
    line("offered (messages/s)", f"{result['offered_per_s']:.0f}/s")
    line("accepted / pushed", f"{result['accepted']:,} / {result['pushed']:,}")
    line("push latency p50 / p99", f"{lat['p50_ms']:.1f} / {lat['p99_ms']:.1f} ms")
    line("web RSS before sockets (MB)", json.dumps(before))
    line("web RSS after the run (MB)", json.dumps(after))
    write_result("websockets_1000", result)


if __name__ == "__main__":
    main()
