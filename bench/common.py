"""Shared pieces of the benchmarks: statistics, results files, the topology, wrk runs.

Benchmarks are programs, not tests: each prints its figures with the baseline it measured in the
same run and the ratio to it, and writes `bench/results/<name>-<UTC time>.json`. They start their
own processes (`bench/harness.py`) on a fresh database and a private Redis, and stop them at the
end; none runs longer than a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results"

_STARTED = time.monotonic()


def _cpu_counters() -> dict[str, float]:
    """The machine's CPU time so far, all and stolen by the host (ticks, /proc/stat), and the time
    some task waited for a CPU (microseconds, /proc/pressure/cpu); empty where Linux lacks them."""
    counters: dict[str, float] = {}
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        counters.update(total=sum(fields[:8]), steal=fields[7])  # user … softirq, steal (guest is in user)
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        counters["waited_us"] = int(some.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        pass
    return counters


_COUNTERS_AT_START = _cpu_counters()


def progress(what: str) -> None:
    """One line on stderr as a phase starts (`[  42 s] what`), so a run of minutes shows where it is;
    the figures go to stdout at the end."""
    print(f"[{time.monotonic() - _STARTED:5.0f} s] {what}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 3),
        "p90_ms": round(pct(ms, 90), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else float("nan"),
    }


def _cpu_ticks(stat: Path) -> tuple[str, int]:
    """A process's name and the user + system CPU ticks it has used so far, from its
    /proc/<pid>/stat (Linux)."""
    name, _, rest = stat.read_text().partition("(")[2].rpartition(")")
    fields = rest.split()
    return name, int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used so far, in seconds (Linux /proc)."""
    total_ticks = sum(_cpu_ticks(Path(f"/proc/{pid}/stat"))[1] for pid in pids)
    return total_ticks / os.sysconf("SC_CLK_TCK")


def cpu_seconds_named(prefix: str) -> float:
    """User + system CPU used so far, in seconds, by every process whose name starts with
    `prefix` (e.g. "postgres": the server and its backends). A process that has exited takes its
    CPU with it: keep the ones measured alive across a measurement."""
    total_ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, ticks = _cpu_ticks(stat)
        except OSError:  # it exited meanwhile
            continue
        if name.startswith(prefix):
            total_ticks += ticks
    return total_ticks / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """What the figures were measured on, including how busy the machine was since the benchmark
    started: the share of CPU time the host took for others (steal: on a virtual machine, time
    the hub did not get) and the share of the time some task here waited for a CPU."""
    found: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
    }
    now, then = _cpu_counters(), _COUNTERS_AT_START
    if "steal" in now and "steal" in then and now["total"] > then["total"]:
        found["steal_share"] = round((now["steal"] - then["steal"]) / (now["total"] - then["total"]), 4)
    if "waited_us" in now and "waited_us" in then:
        elapsed_us = (time.monotonic() - _STARTED) * 1e6
        found["cpu_waited_share"] = round((now["waited_us"] - then["waited_us"]) / elapsed_us, 4)
    return found


def machine_line(found: dict[str, Any]) -> str:
    """`machine()` in a sentence, printed with every benchmark's figures."""
    parts = [f"load average {found['loadavg'][0]:.1f} on {found['cpus']} CPUs"]
    if "steal_share" in found:
        parts.append(f"{found['steal_share']:.1%} of CPU time taken by the host")
    if "cpu_waited_share" in found:
        parts.append(f"some task waiting for a CPU {found['cpu_waited_share']:.0%} of the time")
    return "the machine during the run: " + ", ".join(parts)


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write the JSON result and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"{name}-{stamp}.json"
    found = machine()
    payload = {"benchmark": name, "at": stamp, "machine": found, **data}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\n{machine_line(found)}")
    print(f"result written to {path.relative_to(REPO)}")
    return path


def line(label: str, value: str, target: str = "") -> None:
    print(f"  {label:<52} {value:>22}   {target}")


# Numbers wrk's threads (`tid`) and keeps them, for a `done` that sums their counters.
WRK_THREADS_LUA = r"""
local thread_seq = 0
local threads = {}
function setup(thread)
  thread:set("tid", thread_seq)
  thread_seq = thread_seq + 1
  table.insert(threads, thread)
end
"""

WRK_SCRIPT = (
    WRK_THREADS_LUA
    + r"""
-- Every request gets a unique body (the hub deduplicates identical texts from one sender); the
-- caller makes the template unique per wrk process. Answers marked duplicate are counted.
local counter = 0
function init(args)
  method, path, token, template = args[1], args[2], args[3], args[4]
end
function request()
  counter = counter + 1
  local headers = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
  local body = nil
  if template ~= nil and template ~= "" then
    body = string.gsub(template, "{n}", tid .. "-" .. counter)
  end
  return wrk.format(method, path, headers, body)
end
local reported = 0
duplicates = 0
not_2xx = 0
function response(status, headers, body)
  if status < 200 or status >= 300 then
    not_2xx = not_2xx + 1
  end
  if status >= 300 and reported < 3 then
    reported = reported + 1
    io.stderr:write("non-2xx " .. status .. ": " .. string.sub(body or "", 1, 160) .. "\n")
  end
  if body ~= nil and string.find(body, '"duplicate": *true') then
    duplicates = duplicates + 1
  end
end
function done(summary, latency, requests)
  local total, bad = 0, 0
  for _, thread in ipairs(threads) do
    total = total + (thread:get("duplicates") or 0)
    bad = bad + (thread:get("not_2xx") or 0)
  end
  io.write("Duplicate answers: " .. total .. "\n")
  io.write("Answers not 2xx: " .. bad .. "\n")
end
"""
)


def wrk_script_run(
    url: str, script: str, script_args: list[str], *, seconds: float, connections: int, threads: int = 1
) -> tuple[str, str]:
    """Run wrk with the Lua `script` (given `script_args`) against `url`; return its stdout and
    stderr."""
    import tempfile

    # A file per run: wrk processes started at once must not read one while another rewrites it
    # (a wrk that reads an empty script sends `GET /` instead).
    with tempfile.NamedTemporaryFile("w", prefix="sb-bench-wrk-", suffix=".lua", delete=False) as f:
        f.write(script)
    path = Path(f.name)
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds:g}s",
                "--latency",
                "-s",
                str(path),
                url,
                "--",
            ]
            + script_args,
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
    finally:
        path.unlink()
    return out.stdout, out.stderr


def wrk_rate(out: str) -> dict[str, Any]:
    """What every run's wrk output says: requests/s, requests, and the script's count of answers
    not 2xx (wrk's own count leaves out 3xx)."""
    non2xx = re.search(r"Answers not 2xx: (\d+)", out)
    return {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
    }


def wrk_run(
    url: str,
    *,
    method: str,
    path: str,
    token: str,
    template: str = "",
    seconds: float = 10,
    connections: int = 8,
    threads: int = 1,
) -> dict[str, Any]:
    """Run wrk against one web process; return requests/s, non-2xx count and latency figures."""
    out, err = wrk_script_run(
        url,
        WRK_SCRIPT,
        [method, path, token, template],
        seconds=seconds,
        connections=connections,
        threads=threads,
    )
    duplicates = re.search(r"Duplicate answers: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    latency = dict(re.findall(r"^\s+(50|90|99)%\s+([\d.]+\w+)", out, flags=re.M))
    return {
        **wrk_rate(out),
        "duplicates": int(duplicates.group(1)) if duplicates else 0,
        "socket_errors": errors.group(1) if errors else "",
        "latency": latency,
        "non_2xx_samples": sorted(set(err.splitlines()))[:6],
        "raw": out,
    }


def wrk_parallel(urls: list[str], **kwargs: Any) -> dict[str, Any]:
    """Run one wrk per web process at the same time; return the summed rate and each run. A body
    template's `{n}` gets the run's own prefix, so no two requests of any run send the same text."""
    import concurrent.futures

    template = kwargs.pop("template", "")

    def run(indexed: tuple[int, str]) -> dict[str, Any]:
        i, url = indexed
        return wrk_run(url, template=template.replace("{n}", f"r{i}-{{n}}"), **kwargs)

    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        runs = list(pool.map(run, enumerate(urls)))
    return {
        "requests_per_s": round(sum(r["requests_per_s"] for r in runs), 1),
        "non_2xx": sum(r["non_2xx"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "runs": [{k: v for k, v in r.items() if k != "raw"} for r in runs],
    }


def add_event_loop_option(parser: argparse.ArgumentParser, *, processes: str) -> None:
    """`--event-loop`: the loop `processes` run on (SWITCHBOARD_EVENT_LOOP), uvloop by default."""
    from hub.web import EVENT_LOOPS

    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=EVENT_LOOPS[0],
        help=f"{processes} event loop: asyncio is the baseline for uvloop",
    )


def sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def django_in_process(*, database_url: str, redis_url: str | None = None, **env: str) -> None:
    """Configure Django in this process against `database_url` (and Redis, if given), with the
    anti-flood limits lifted, and set it up. Call once, before importing models."""
    import tempfile

    for key in [k for k in os.environ if k.startswith("SWITCHBOARD_") or k in {"DATABASE_URL", "REDIS_URL"}]:
        del os.environ[key]
    from hub_topology import LOAD_ENV

    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "hub.settings",
            "DATABASE_URL": database_url,
            "SWITCHBOARD_HOME": tempfile.mkdtemp(prefix="sb-bench-home-"),
            "SWITCHBOARD_SECRET_KEY": "bench-" + "s" * 44,
            "SWITCHBOARD_JOBS": "inline",
            **LOAD_ENV,
            **env,
        }
    )
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out
