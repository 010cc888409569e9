"""Send → push latency and sustained send throughput, production topology and embedded mode.

    .venv/bin/python bench/send_path.py            # full run (2–3 minutes)
    .venv/bin/python bench/send_path.py --smoke    # a few seconds per phase, to check it works
    .venv/bin/python bench/send_path.py --only latency  # the floor and the latency alone (~20 s)

Production: two daphne web processes, a Celery worker and beat, PostgreSQL, a private Redis.
Embedded: `switchboard serve` (one process, SQLite, in-memory layer). In the same run it measures:

- the floor: one PostgreSQL commit + one Redis PUBLISH + one Unix-socket write and read, in a loop;
- send → push latency: an agent on the WebSocket of web 1, a sender posting to web 0 at a fixed
  offered rate (open loop, 100 messages/s), latency from the start of the POST to the push arriving,
  after a 1 s warm-up at the same rate that is not timed (`--warm-up`); with `--senders N`, N
  senders take turns (each sends every N/rate seconds, as agents that each send now and then);
- sustained single sends/s with wrk on both web processes, one sender, against the rate of the
  authenticated no-op `GET /api/v1/ping` on the same processes in the same run, with as many
  connections: 4 and then 16 connections per process by default (`--connections`), so that
  about 8 and 32 of the sender's sends are in flight at once (`--sends-apart` turns off sending
  a sender's concurrent sends together);
- batch sends (`POST /api/v1/messages/batch`, 100 messages per request), messages/s.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from common import (
    add_event_loop_option,
    cpu_seconds,
    line,
    progress,
    summary_ms,
    write_result,
    wrk_parallel,
)
from harness import (
    LOAD_ENV,
    PRODUCTION_SWEEP,
    Registered,
    embedded_hub,
    production_hub,
    register,
    rss_mb,
)


def measure_floor(pg_url: str, redis_url: str, *, n: int) -> dict[str, Any]:
    """One commit + one publish + one Unix-socket write (and its read), n times in a row."""
    import psycopg
    import redis

    conn = psycopg.connect(pg_url)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, body text)")
    conn.commit()
    r = redis.Redis.from_url(redis_url)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    payload = json.dumps({"id": "x" * 36, "text": "floor " * 8})
    times: list[float] = []
    started = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        conn.execute("INSERT INTO bench_floor (body) VALUES (%s)", (payload,))
        conn.commit()
        r.publish("bench.floor", payload)
        a.sendall(payload.encode() + b"\n")
        got = b""
        while not got.endswith(b"\n"):
            got += b.recv(65536)
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - started
    conn.execute("DROP TABLE bench_floor")
    conn.commit()
    conn.close()
    a.close()
    b.close()
    return {**summary_ms(times), "per_s": round(n / total, 1)}


class PushTimer(threading.Thread):
    """An agent on /ws/agent/ that notes when each message id arrives (and acks)."""

    def __init__(self, url: str, agent: Registered):
        super().__init__(daemon=True)
        self.url = url.replace("http://", "ws://") + "/ws/agent/"
        self.agent = agent
        self.arrived: dict[str, float] = {}
        self.ready = threading.Event()
        self.halt = threading.Event()

    def run(self) -> None:
        from websockets.sync.client import connect

        with connect(self.url, additional_headers=self.agent.headers, open_timeout=20) as ws:
            while not self.halt.is_set():
                try:
                    raw = ws.recv(timeout=0.2)
                except TimeoutError:
                    continue
                now = time.perf_counter()
                frame = json.loads(raw)
                if frame["type"] == "hello":
                    self.ready.set()
                elif frame["type"] == "messages":
                    ids = [m["id"] for m in frame["messages"]]
                    for mid in ids:
                        self.arrived.setdefault(mid, now)
                    ws.send(json.dumps({"type": "ack", "ids": ids}))


def push_latency(
    send_url: str,
    push_url: str,
    *,
    rate: float,
    seconds: float,
    tag: str,
    warm_up: float = 1.0,
    senders: int = 1,
) -> dict[str, Any]:
    """Open-loop sends at `rate`/s to web `send_url`, from `senders` sessions taking turns; an
    agent on `push_url` times the pushes.

    The first `warm_up` seconds of sends are made but not timed: the client's connections and the
    web process's request threads (each with its own database connection) are opened then, once,
    as in any process that has served a few requests; what follows is the steady state."""
    turns = [register(send_url, f"lat-sender-{tag}-{k}") for k in range(senders)]
    agent = register(push_url, f"lat-agent-{tag}")
    timer = PushTimer(push_url, agent)
    timer.start()
    if not timer.ready.wait(20):
        raise RuntimeError("the timing agent never connected")
    n = int(rate * seconds)
    started_at: dict[str, float] = {}
    answered_at: dict[str, float] = {}
    failures: list[str] = []
    local = threading.local()

    def client() -> httpx.Client:
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=send_url, timeout=30)
        return local.c

    def one(i: int, due: float) -> None:
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = time.perf_counter()
        r = client().post(
            "/api/v1/messages",
            json={"to": agent.ref, "message": f"latency {tag} {i}"},
            headers=turns[i % senders].headers,
        )
        if r.status_code != 201:
            failures.append(f"{r.status_code} {r.text[:100]}")
            return
        answered = time.perf_counter()
        mid = r.json()["id"]
        if i >= 0:  # negative: a warm-up send
            started_at[mid], answered_at[mid] = t, answered

    warm = int(rate * warm_up)
    begin = time.perf_counter() + 0.5 + warm_up
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i, begin + i / rate) for i in range(-warm, n)]
        for f in futures:
            f.result()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(set(started_at) & set(timer.arrived)) < len(started_at):
        time.sleep(0.05)
    timer.halt.set()
    timer.join(5)
    pushed = [m for m in started_at if m in timer.arrived]
    lat = [timer.arrived[m] - started_at[m] for m in pushed]
    return {
        "offered_per_s": rate,
        "senders": senders,
        "warm_up_s": warm_up,
        "sent": len(started_at),
        "pushed": len(lat),
        "failed_sends": len(failures),
        "failures": failures[:5],
        **summary_ms(lat),
        # The two halves: the POST's answer, and the push's arrival after that answer.
        "post": summary_ms([answered_at[m] - started_at[m] for m in started_at]),
        "push_after_answer": summary_ms([timer.arrived[m] - answered_at[m] for m in pushed]),
    }


def batch_rate(
    urls: list[str], senders: list[Registered], to: str, *, seconds: float, size: int = 100
) -> dict:
    """Closed-loop batch sends (one request carries `size` messages), one client per web process."""
    sent = [0] * len(urls)
    failures: list[str] = []
    stop_at = time.perf_counter() + seconds

    def run(i: int) -> None:
        with httpx.Client(base_url=urls[i], headers=senders[i].headers, timeout=60) as c:
            k = 0
            while time.perf_counter() < stop_at:
                body = {"messages": [{"to": to, "message": f"batch {i}-{k}-{j}"} for j in range(size)]}
                k += 1
                r = c.post("/api/v1/messages/batch", json=body)
                if r.status_code == 404:
                    failures.append("no batch endpoint")
                    return
                if r.status_code != 201:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                    return
                sent[i] += len(r.json()["results"])

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return {
        "messages": sum(sent),
        "per_s": round(sum(sent) / elapsed, 1),
        "batch": size,
        "failures": failures[:3],
    }


def throughput(
    urls: list[str],
    web_pids: list[int],
    *,
    seconds: float,
    tag: str,
    connections: list[int],
    batch_size: int = 100,
    database_url: str | None = None,
) -> dict[str, Any]:
    """wrk on every web process: for each number of connections per process, the no-op ping then
    single sends (a sender of its own for each); then batch sends. The web processes' CPU per
    request is taken from /proc around the ping and send phases: unlike the rates, it does not
    depend on what else (wrk, PostgreSQL) shares the machine's cores."""
    sink = register(urls[0], f"tp-sink-{tag}")
    singles = [
        _singles(
            urls, web_pids, sink, seconds=seconds, tag=f"{tag}-c{n}", connections=n, database_url=database_url
        )
        for n in connections
    ]
    batch_senders = [register(u, f"tp-batch-{tag}-{i}") for i, u in enumerate(urls)]
    progress(f"{tag}: batch sends of {batch_size}, {seconds:g} s")
    batch = batch_rate(urls, batch_senders, sink.ref, seconds=seconds, size=batch_size)
    return {"singles": singles, "batch": batch}


def _singles(
    urls: list[str],
    web_pids: list[int],
    sink: Registered,
    *,
    seconds: float,
    tag: str,
    connections: int,
    database_url: str | None,
) -> dict[str, Any]:
    """The no-op ping, then single sends, each with `connections` wrk connections per web process."""
    sender = register(urls[0], f"tp-sender-{tag}")
    progress(f"{tag}: wrk on the no-op ping, {connections} connections per web, {seconds:g} s")
    before = cpu_seconds(web_pids)
    ping = wrk_parallel(
        urls, method="GET", path="/api/v1/ping", token=sender.token, seconds=seconds, connections=connections
    )
    ping_cpu = cpu_seconds(web_pids) - before
    body = json.dumps({"to": sink.ref, "message": "throughput " + tag + " {n}"})
    progress(f"{tag}: wrk on single sends, {connections} connections per web, {seconds:g} s")
    before = cpu_seconds(web_pids)
    sends = wrk_parallel(
        urls,
        method="POST",
        path="/api/v1/messages",
        token=sender.token,
        template=body,
        seconds=seconds,
        connections=connections,
    )
    sends_cpu = cpu_seconds(web_pids) - before
    return {
        "connections_per_web": connections,
        "ping_per_s": ping["requests_per_s"],
        "ping_non_2xx": ping["non_2xx"],
        "sends_per_s": sends["requests_per_s"],
        "sends_non_2xx": sends["non_2xx"],
        "sends_duplicate_answers": sends["duplicates"],  # must be 0: every body is unique
        "sends_vs_ping": round(sends["requests_per_s"] / ping["requests_per_s"], 3),
        "sends_per_write": sends_per_write(database_url, sender.id) if database_url else None,
        "web_cpu_ms_per_ping": _per_request_ms(ping_cpu, ping),
        "web_cpu_ms_per_send": _per_request_ms(sends_cpu, sends),
        "wrk": {"ping": ping["runs"], "sends": sends["runs"]},
    }


def sends_per_write(database_url: str, sender_id: str) -> float:
    """How many of the sender's messages each write carried on average: the messages one write
    stores share their `created_at` (a lone send, or a group sent together as one batch)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT created_at) FROM messaging_message WHERE sender_id = %s",
            [sender_id],
        ).fetchone()
    sent, writes = row if row else (0, 0)
    return round(sent / writes, 2) if writes else float("nan")


def _per_request_ms(cpu_s: float, run: dict[str, Any]) -> float:
    requests = sum(r["requests"] for r in run["runs"])
    return round(cpu_s * 1000 / requests, 3) if requests else float("nan")


def hub_env(args: argparse.Namespace) -> dict[str, str]:
    """The hub's settings for a run: the anti-flood limits lifted, the production sweep pace,
    sends together unless asked, and the event loop asked for."""
    return {
        **LOAD_ENV,
        **PRODUCTION_SWEEP,
        **({"SWITCHBOARD_SEND_TOGETHER": "0"} if args.sends_apart else {}),
        "SWITCHBOARD_EVENT_LOOP": args.event_loop,
    }


def production(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with production_hub(workdir, hub_env(args)) as (hub, db, redis):
        progress(f"the floor: {args.floor_n:,} commits + publishes + socket writes")
        floor = measure_floor(db, redis.url(), n=args.floor_n)
        progress(f"send → push latency at {args.rate:g}/s, {args.warm_up:g} s warm-up + {args.seconds:g} s")
        latency = push_latency(
            hub.web_urls[0],
            hub.web_urls[1],
            rate=args.rate,
            seconds=args.seconds,
            tag="prod",
            warm_up=args.warm_up,
            senders=args.senders,
        )
        if args.only == "latency":
            return {"floor": floor, "latency": latency}
        if args.analyze:
            progress("ANALYZE: the planner's statistics, as autovacuum gathers them in a hub's first minute")
            analyze(db)
        tp = throughput(
            hub.web_urls,
            [p.pid for p in hub.webs],
            seconds=args.seconds,
            tag="prod",
            batch_size=args.batch_size,
            connections=args.connections,
            database_url=db,
        )
        memory = {p.name: round(rss_mb(p.pid), 1) for p in hub.webs}
        return {
            "floor": floor,
            "latency": latency,
            "analyzed_before_throughput": args.analyze,
            "throughput": tp,
            "web_rss_mb": memory,
        }


def analyze(database_url: str) -> None:
    """Gather the planner's statistics afresh, as autovacuum (or the hub's own job, with autovacuum
    off) does a minute into a hub's traffic: the throughput phases measure a hub past its first
    minute, whose statistics were gathered from more than its first hundred rows. (It mattered:
    before the dedupe lookup had a key of its own, batch sends ran at ~5,600 msg/s on a fresh
    database and ~2,200 on an analyzed one; `--no-analyze` leaves the hub's own statistics.)"""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def batch_only(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The production topology's batch phase alone, `--repeat` times on one hub (fresh senders
    each time): short enough to run several times, alternating with another commit (A/B pairs)."""
    with production_hub(workdir, hub_env(args)) as (hub, _db, _redis):
        sink = register(hub.web_urls[0], "batch-sink")
        runs = []
        for k in range(args.repeat):
            progress(f"batch sends of {args.batch_size}, run {k + 1} of {args.repeat}, {args.seconds:g} s")
            senders = [register(u, f"batch-{k}-{i}") for i, u in enumerate(hub.web_urls)]
            runs.append(
                batch_rate(hub.web_urls, senders, sink.ref, seconds=args.seconds, size=args.batch_size)
            )
        return {"runs": runs}


def embedded(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with embedded_hub(workdir, hub_env(args)) as (url, _home, proc):
        progress(
            f"emb: send → push latency at {args.rate:g}/s, {args.warm_up:g} s warm-up + {args.seconds:g} s"
        )
        latency = push_latency(
            url,
            url,
            rate=args.rate,
            seconds=args.seconds,
            tag="emb",
            warm_up=args.warm_up,
            senders=args.senders,
        )
        tp = throughput(
            [url],
            [proc.pid],
            seconds=args.seconds,
            tag="emb",
            batch_size=args.batch_size,
            connections=args.connections,
        )
        return {"latency": latency, "throughput": tp, "rss_mb": round(rss_mb(proc.pid), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="2 s phases: check that it runs")
    parser.add_argument("--rate", type=float, default=100.0, help="offered sends/s for the latency phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument(
        "--senders", type=int, default=1, help="sessions taking turns to send in the latency phase"
    )
    parser.add_argument("--floor-n", type=int, default=2000)
    parser.add_argument("--warm-up", type=float, default=1.0, help="untimed seconds before the latency phase")
    parser.add_argument(
        "--only",
        choices=["production", "latency", "embedded", "batch"],
        default=None,
        help="latency: the production topology's floor and send → push latency alone; batch: its phase alone",
    )
    parser.add_argument("--repeat", type=int, default=2, help="with --only batch: runs on one hub")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batch request")
    parser.add_argument(
        "--connections",
        type=int,
        nargs="+",
        default=[4, 16],
        help="wrk connections per web process for pings and single sends (each in turn)",
    )
    parser.add_argument(
        "--sends-apart",
        action="store_true",
        help="every single send alone (SWITCHBOARD_SEND_TOGETHER=0): the baseline for sends together",
    )
    add_event_loop_option(parser, processes="the web processes' (and embedded mode's)")
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="production: skip the ANALYZE before the throughput phases (keep the hub's own statistics)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.floor_n = 2.0, 200
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    try:
        result: dict[str, Any] = {"args": vars(args)}
        if args.only in (None, "production", "latency"):
            result["production"] = production(args, workdir)
        if args.only in (None, "embedded"):
            result["embedded"] = embedded(args, workdir)
        if args.only == "batch":
            result["batch_only"] = batch_only(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(result)
    write_result("send_path", result)


def _from(lat: dict[str, Any]) -> str:
    senders = lat.get("senders", 1)
    return f", {senders} senders" if senders > 1 else ""


def latency_halves(lat: dict[str, Any]) -> None:
    post, push = lat["post"], lat["push_after_answer"]
    line("  the POST's answer, p50 / p99", f"{post['p50_ms']:.2f} / {post['p99_ms']:.2f} ms")
    line("  then the push, p50 / p99", f"{push['p50_ms']:.2f} / {push['p99_ms']:.2f} ms")


def report_singles(tp: dict[str, Any], *, floor_per_s: float | None, apart: bool, production: bool) -> None:
    """One number of connections' ping and single-send figures, against the production topology's
    targets or embedded mode's."""
    n = tp["connections_per_web"]
    line(f"authenticated no-op GET /api/v1/ping, {n} connections per web", f"{tp['ping_per_s']:.0f}/s")
    line(
        f"single sends, {n} connections per web",
        f"{tp['sends_per_s']:.0f}/s",
        "target ≥ 800/s" if production else "target ≥ 400/s",
    )
    if tp.get("sends_per_write") is not None:
        line(
            f"  messages per write (sends together {'off' if apart else 'on'})",
            f"{tp['sends_per_write']:.2f}",
        )
    line("  as a share of the no-op rate", f"{tp['sends_vs_ping']:.0%}", "target ≥ 60%" if production else "")
    if floor_per_s:
        line("  ratio to the floor rate", f"{tp['sends_per_s'] / floor_per_s:.2f}×")
    send, ping = tp["web_cpu_ms_per_send"], tp["web_cpu_ms_per_ping"]
    line("  web-process CPU per send / per ping", f"{send:.2f} / {ping:.2f} ms ({send / ping:.2f}×)")
    line("  non-2xx answers (ping / sends)", f"{tp['ping_non_2xx']} / {tp['sends_non_2xx']}")
    line("  sends answered as duplicates (must be 0)", str(tp["sends_duplicate_answers"]))


def report(result: dict[str, Any]) -> None:
    print("\nSend path")
    prod = result.get("production")
    if prod:
        f, lat = prod["floor"], prod["latency"]
        print(" production topology (2 daphne, Celery worker + beat, PostgreSQL, Redis)")
        line("floor: commit + publish + socket write, p50 / p99", f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} ms")
        line("floor rate (sequential)", f"{f['per_s']:.0f}/s")
        line(
            f"send → push p50 / p99 at {lat['offered_per_s']:.0f}/s offered{_from(lat)}",
            f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} ms",
            "target ≤ 5 / ≤ 25 ms",
        )
        line(
            "  ratio to the floor (p50 / p99)",
            f"{lat['p50_ms'] / f['p50_ms']:.1f}× / {lat['p99_ms'] / f['p99_ms']:.1f}×",
        )
        latency_halves(lat)
        line("  pushed / sent", f"{lat['pushed']} / {lat['sent']}")
        tp = prod.get("throughput")  # none with --only latency
        if tp:
            apart = result["args"].get("sends_apart")
            for singles in tp["singles"]:
                report_singles(singles, floor_per_s=f["per_s"], apart=apart, production=True)
            line(
                f"batch sends ({tp['batch']['batch']} per request)",
                f"{tp['batch']['per_s']:.0f} msg/s",
                "target ≥ 5,000/s",
            )
    for run in result.get("batch_only", {}).get("runs", []):
        line(f"batch sends ({run['batch']} per request)", f"{run['per_s']:.0f} msg/s", "target ≥ 5,000/s")
    emb = result.get("embedded")
    if emb:
        lat, tp = emb["latency"], emb["throughput"]
        print(" embedded mode (switchboard serve: one process, SQLite, in-memory layer)")
        line(
            f"send → push p50 / p99 at {lat['offered_per_s']:.0f}/s offered{_from(lat)}",
            f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} ms",
        )
        latency_halves(lat)
        for singles in tp["singles"]:
            report_singles(
                singles, floor_per_s=None, apart=result["args"].get("sends_apart"), production=False
            )
        line(f"batch sends ({tp['batch']['batch']} per request)", f"{tp['batch']['per_s']:.0f} msg/s")


if __name__ == "__main__":
    main()
