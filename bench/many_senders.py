"""Many senders: a team's traffic, each send from a random session to another random one.

    .venv/bin/python bench/many_senders.py            # both modes, about 2 minutes
    .venv/bin/python bench/many_senders.py --smoke    # 2 s phases, to check it works
    .venv/bin/python bench/many_senders.py --only embedded

200 sessions are registered (`--sessions`). wrk holds 16 connections (`--connections`, split
evenly over the web processes); every request picks a random session's token and, for a send, a
random other session as the recipient (by ref), with a text no request repeats. The baseline is
the authenticated no-op `GET /api/v1/ping` with the same tokens, the same wrk connections, on
the same hub in the same run; ping and send phases alternate (`--rounds`), so both see the same
machine. Printed: sends/s, no-op/s, their ratio, p50/p99 of each, the web processes' CPU per
request of each kind (when they are busy, the ratio follows these), and the deliveries' states.

Embedded: `switchboard serve` with its defaults (one process, SQLite). Production: two daphne web
processes, a Celery worker and beat, PostgreSQL and a private Redis, as `bench/send_path.py`
starts them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from common import WRK_THREADS_LUA, cpu_seconds, line, progress, write_result, wrk_rate, wrk_script_run
from harness import (
    LOAD_ENV,
    PRODUCTION_SWEEP,
    Registered,
    embedded_hub,
    production_hub,
    register,
)

# Each request: a random session's token; a send goes to a random other session, with a text no
# other request of the run carries (the hub answers an identical text from one sender with the
# earlier send). Sessions come from a file of "token ref" lines (the first argument).
MANY_SENDERS_LUA = (
    WRK_THREADS_LUA
    + r"""
local sessions = {}
function init(args)
  for l in io.lines(args[1]) do
    local token, ref = string.match(l, "(%S+) (%S+)")
    table.insert(sessions, {token = token, ref = ref})
  end
  mode, prefix = args[2], args[3]
  math.randomseed(os.time() * 1000 + tid * 7919 + #prefix)
  counter = 0
  not_2xx = 0
end
function request()
  counter = counter + 1
  local n = #sessions
  local i = math.random(n)
  local headers = {["Authorization"] = "Bearer " .. sessions[i].token}
  if mode == "ping" then
    return wrk.format("GET", "/api/v1/ping", headers, nil)
  end
  local j = math.random(n - 1)
  if j >= i then j = j + 1 end
  headers["Content-Type"] = "application/json"
  local body = '{"to": "' .. sessions[j].ref .. '", "message": "many senders ' .. prefix .. '-' .. tid .. '-' .. counter .. '"}'
  return wrk.format("POST", "/api/v1/messages", headers, body)
end
local reported = 0
function response(status, headers, body)
  if status < 200 or status >= 300 then
    not_2xx = not_2xx + 1
    if reported < 3 then
      reported = reported + 1
      io.stderr:write("non-2xx " .. status .. ": " .. string.sub(body or "", 1, 160) .. "\n")
    end
  end
end
function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do
    bad = bad + (thread:get("not_2xx") or 0)
  end
  io.write("Answers not 2xx: " .. bad .. "\n")
  io.write(string.format("p50 %.3f\np99 %.3f\n", latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""
)


def wrk_many(
    urls: list[str], sessions_file: Path, *, mode: str, tag: str, seconds: float, connections: int
) -> dict[str, Any]:
    """One wrk per web process at once, `connections` split evenly over them; requests/s summed,
    latency percentiles of each run (ms) and their request-weighted p50 and worst p99."""
    each = max(1, connections // len(urls))

    def run(indexed: tuple[int, str]) -> dict[str, Any]:
        i, url = indexed
        out, err = wrk_script_run(
            url, MANY_SENDERS_LUA, [str(sessions_file), mode, f"{tag}w{i}"], seconds=seconds, connections=each
        )
        return {
            **wrk_rate(out),
            "p50_ms": float(re.search(r"^p50 ([\d.]+)", out, re.M).group(1)),
            "p99_ms": float(re.search(r"^p99 ([\d.]+)", out, re.M).group(1)),
            "non_2xx_samples": sorted(set(err.splitlines()))[:3],
        }

    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        runs = list(pool.map(run, enumerate(urls)))
    total = sum(r["requests"] for r in runs) or 1
    return {
        "requests_per_s": round(sum(r["requests_per_s"] for r in runs), 1),
        "non_2xx": sum(r["non_2xx"] for r in runs),
        "p50_ms": round(sum(r["p50_ms"] * r["requests"] for r in runs) / total, 2),
        "p99_ms": max(r["p99_ms"] for r in runs),
        "runs": runs,
    }


def measure(
    urls: list[str], web_pids: list[int], sessions: list[Registered], args: argparse.Namespace, tag: str
) -> dict[str, Any]:
    """Ping and send phases in turn, `args.rounds` times, with the same sessions and connections;
    with the CPU the web processes (`web_pids`) used per request of each kind."""
    folder = Path(tempfile.mkdtemp(prefix="sb-bench-sessions-"))
    sessions_file = folder / "sessions.txt"
    sessions_file.write_text("".join(f"{s.token} {s.ref}\n" for s in sessions))
    sessions_file.chmod(0o600)
    pings, sends = [], []
    cpu = {"ping": 0.0, "send": 0.0}
    try:
        for k in range(args.rounds):
            for mode, into in (("ping", pings), ("send", sends)):
                progress(f"{tag}: {mode}, round {k + 1} of {args.rounds}, {args.seconds:g} s")
                before = cpu_seconds(web_pids)
                into.append(
                    wrk_many(
                        urls,
                        sessions_file,
                        mode=mode,
                        tag=f"{tag}{k}",
                        seconds=args.seconds,
                        connections=args.connections,
                    )
                )
                cpu[mode] += cpu_seconds(web_pids) - before
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def mean(runs: list[dict[str, Any]], key: str) -> float:
        return round(sum(r[key] for r in runs) / len(runs), 2)

    def cpu_ms_per_request(mode: str, runs: list[dict[str, Any]]) -> float:
        requests = sum(run["requests"] for r in runs for run in r["runs"])
        return round(cpu[mode] * 1000 / requests, 3) if requests else float("nan")

    ping_rate, send_rate = mean(pings, "requests_per_s"), mean(sends, "requests_per_s")
    return {
        "sessions": len(sessions),
        "connections": args.connections,
        "webs": len(urls),
        "ping_per_s": ping_rate,
        "sends_per_s": send_rate,
        "sends_vs_ping": round(send_rate / ping_rate, 3) if ping_rate else float("nan"),
        "ping_p50_ms": mean(pings, "p50_ms"),
        "ping_p99_ms": mean(pings, "p99_ms"),
        "send_p50_ms": mean(sends, "p50_ms"),
        "send_p99_ms": mean(sends, "p99_ms"),
        "web_cpu_ms_per_ping": cpu_ms_per_request("ping", pings),
        "web_cpu_ms_per_send": cpu_ms_per_request("send", sends),
        "ping_non_2xx": sum(r["non_2xx"] for r in pings),
        "sends_non_2xx": sum(r["non_2xx"] for r in sends),
        "rounds": {"ping": pings, "send": sends},
    }


def sessions_registered(url: str, n: int, tag: str) -> list[Registered]:
    progress(f"{tag}: registering {n} sessions")
    return [register(url, f"ms-{tag}-{i:03d}") for i in range(n)]


STATES_SQL = "SELECT state, COUNT(*) FROM messaging_delivery GROUP BY state ORDER BY state"


def production(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with production_hub(workdir, hub_env()) as (hub, db, _redis):
        sessions = sessions_registered(hub.web_urls[0], args.sessions, "prod")
        figures = measure(hub.web_urls, [w.pid for w in hub.webs], sessions, args, "prod")
        figures["delivery_states"] = dict(hub.sql(STATES_SQL))
        return figures


def embedded(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with embedded_hub(workdir, hub_env()) as (url, home, proc):
        sessions = sessions_registered(url, args.sessions, "emb")
        figures = measure([url], [proc.pid], sessions, args, "emb")
        with contextlib.closing(
            sqlite3.connect(f"file:{home / 'switchboard.sqlite3'}?mode=ro", uri=True)
        ) as db:
            figures["delivery_states"] = dict(db.execute(STATES_SQL).fetchall())
        return figures


def hub_env() -> dict[str, str]:
    """The anti-flood limits lifted (wrk sends faster than any agent), the production sweep pace;
    everything else as the hub's defaults."""
    return {**LOAD_ENV, **PRODUCTION_SWEEP}


def report(result: dict[str, Any]) -> None:
    print(f"\nMany senders: {result['args']['sessions']} sessions, random pairs")
    for mode, title in (
        ("embedded", "embedded mode (switchboard serve: one process, SQLite)"),
        ("production", "production topology (2 daphne, Celery worker + beat, PostgreSQL, Redis)"),
    ):
        f = result.get(mode)
        if not f:
            continue
        print(f" {title}, {f['connections']} connections")
        line("authenticated no-op GET /api/v1/ping", f"{f['ping_per_s']:.0f}/s")
        line("  p50 / p99", f"{f['ping_p50_ms']:.1f} / {f['ping_p99_ms']:.1f} ms")
        line("sends, random sender → random recipient", f"{f['sends_per_s']:.0f}/s")
        line("  p50 / p99", f"{f['send_p50_ms']:.1f} / {f['send_p99_ms']:.1f} ms")
        line("  as a share of the no-op rate", f"{f['sends_vs_ping']:.2f}×", "target ≥ 0.6×")
        ping_cpu, send_cpu = f["web_cpu_ms_per_ping"], f["web_cpu_ms_per_send"]
        line("web-process CPU per ping / per send", f"{ping_cpu:.2f} / {send_cpu:.2f} ms")
        line("  the share that CPU allows (ping ÷ send)", f"{ping_cpu / send_cpu:.2f}×")
        line("  non-2xx answers (ping / sends)", f"{f['ping_non_2xx']} / {f['sends_non_2xx']}")
        line("  deliveries by state", ", ".join(f"{k} {v}" for k, v in f["delivery_states"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="2 s phases, one round: check that it runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="ping + send phases, in turn")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--connections", type=int, default=16, help="wrk connections in all")
    parser.add_argument("--only", choices=["embedded", "production"], default=None)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 2.0, 1
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    result: dict[str, Any] = {"args": vars(args)}
    try:
        if args.only in (None, "embedded"):
            result["embedded"] = embedded(args, workdir / "emb")
        if args.only in (None, "production"):
            result["production"] = production(args, workdir / "prod")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(result)
    write_result("many_senders", result)


if __name__ == "__main__":
    main()
