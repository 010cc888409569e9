"""Start and stop the production topology as real processes: no containers, no mocks.

A package of its own, outside `tests/` and `bench/`: the integration tests
(`tests/integration/harness.py`) and the benchmarks (`bench/harness.py`) both start hubs with it,
and neither imports the other.

- `RedisServer`: a private `redis-server` on a free loopback port (flush or restart it freely:
  nobody else uses it; the shared Redis on 6379 is never touched).
- `database_create` / `database_drop`: a throwaway database named `sb_prod_<hex>` on the shared
  PostgreSQL (only CREATE/DROP DATABASE of that one name).
- `PostgresCluster`: a private PostgreSQL cluster (initdb under a temp folder, run as the
  `postgres` user, on a free port) that a fault test may stop and start; the system cluster is
  never stopped.
- `Hub`: `manage.py migrate`, then N daphne web processes, a Celery worker and Celery beat, all
  with the same DATABASE_URL / REDIS_URL / SWITCHBOARD_* environment, each in its own process group,
  with a log file, a bounded start-up wait and a stop that ends in SIGKILL if SIGTERM is ignored.

Every wait here is bounded; every process started is registered and stopped at interpreter exit
even if a test run is interrupted.

The agent's side and the one-process hub, in modules of their own:
- `embedded`: `switchboard serve` as a user starts it (SQLite in a home folder of its own);
- `hook`: `switchboard hook` as Claude Code runs it, a fresh process per event;
- `hung`: a listener that takes every connection and never answers, a hub that hangs.

What the tests and benchmarks put into a hub in their own process is in `hub_fixtures`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PG_ADMIN_URL = os.environ.get("SB_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
ENROLL_KEY = "sb-prod-enroll-" + "k" * 24

# Limits a load test lifts so that it measures delivery, not the anti-flood rules (which the
# API suites test): per-pair and hub-wide rates, and the unread cap per recipient.
LOAD_ENV = {
    "SWITCHBOARD_RATE_PAIR": "10000000",
    "SWITCHBOARD_RATE_HUB": "10000000",
    "SWITCHBOARD_UNREAD_PER_RECIPIENT": "10000000",
}

_running: list[Proc] = []


# Ports handed out below the kernel's ephemeral range, one slice per pytest-xdist worker and one
# for a run without workers.
_RESERVED_FIRST, _RESERVED_SLICE = 20000, 1000
_handed_out: set[int] = set()


def _ephemeral_first() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and no bind to port 0 will be given.

    Between this call and the hub binding the port, any listener another test or xdist worker
    opens on port 0 takes a port from the kernel's ephemeral range; the port returned here lies
    below that range, in this worker's own slice, so such a listener can never take it first.
    """
    # A run without xdist (the browser tests beside the integration suite) has slice 0.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    index = int(worker) + 1 if worker.isdigit() else 0
    slices = (_ephemeral_first() - _RESERVED_FIRST) // _RESERVED_SLICE
    if slices < 1:  # no room below the ephemeral range: let the kernel choose
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    first = _RESERVED_FIRST + index % slices * _RESERVED_SLICE
    for _ in range(2):
        start = secrets.randbelow(_RESERVED_SLICE)
        for step in range(_RESERVED_SLICE):
            port = first + (start + step) % _RESERVED_SLICE
            # A port handed out is not given twice (its hub may not have bound it yet).
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
        _handed_out.clear()  # every port of the slice handed out once: long-stopped hubs freed theirs
    raise RuntimeError(f"no free loopback port in {first}-{first + _RESERVED_SLICE - 1}")


def wait_until(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Call `check` until it returns something truthy; raise TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # the thing we wait for may fail until it is up
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what} (last error: {last_error!r})")


@dataclass
class Proc:
    """One child process in its own process group, logging to a file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed when we stop
        self.popen = subprocess.Popen(
            self.argv, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        _running.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process and every child in its group (a crash, not a shutdown)."""
        self.signal_group(signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        self._forget()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the group, wait up to `timeout`, then SIGKILL what is left."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        self.signal_group(signal.SIGKILL)  # children that outlived their parent
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._forget()

    def _forget(self) -> None:
        with contextlib.suppress(ValueError):
            _running.remove(self)


@atexit.register
def _stop_everything() -> None:
    for proc in list(reversed(_running)):
        proc.stop(timeout=3)


# --- Redis ------------------------------------------------------------------------------------


@dataclass
class RedisServer:
    """A private redis-server on a free port (no persistence)."""

    workdir: Path
    port: int = 0
    proc: Proc | None = None

    def start(self) -> RedisServer:
        self.port = self.port or free_port()
        self.proc = Proc(
            f"redis:{self.port}",
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.workdir),
            ],
            dict(os.environ),
            self.workdir / f"redis-{self.port}.log",
        ).start()
        wait_until(self.ping, timeout=10, what=f"redis-server on port {self.port}")
        return self

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip()

    def ping(self) -> bool:
        return self.cli("ping") == "PONG"

    def flush(self) -> None:
        self.cli("flushall")

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()  # an abrupt stop, like a crashed Redis: nothing is saved
            self.proc = None

    def restart(self, *, pause: float = 0.0) -> None:
        """Kill Redis (losing everything in it) and start an empty one on the same port."""
        self.stop()
        time.sleep(pause)
        self.start()


# --- PostgreSQL -------------------------------------------------------------------------------


def _pg_url(base: str, dbname: str) -> str:
    return base.rsplit("/", 1)[0] + "/" + dbname


def database_create(admin_url: str = PG_ADMIN_URL, *, prefix: str = "sb_prod_") -> str:
    """Create a fresh database on the server `admin_url` points at; return its URL."""
    import psycopg

    name = f"{prefix}{secrets.token_hex(5)}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return _pg_url(admin_url, name)


_template: dict[str, str] = {}


def database_migrated(admin_url: str = PG_ADMIN_URL) -> str:
    """A fresh database with every migration applied: a copy of a template this process migrated
    once (CREATE DATABASE ... TEMPLATE takes a fraction of a second; migrating takes ~10 s)."""
    import psycopg

    if admin_url not in _template:
        url = database_create(admin_url, prefix="sb_prod_tpl_")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_") and k != "REDIS_URL"}
        home = Path(tempfile.mkdtemp(prefix="sb-prod-tpl-"))
        subprocess.run(
            [str(VENV_BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=REPO,
            env={
                **env,
                "DATABASE_URL": url,
                "SWITCHBOARD_HOME": str(home),
                "SWITCHBOARD_SECRET_KEY": "x" * 50,
            },
            check=True,
            timeout=300,
            capture_output=True,
        )
        shutil.rmtree(home, ignore_errors=True)
        _template[admin_url] = url
        atexit.register(database_drop, url, admin_url)
    template = _template[admin_url].rsplit("/", 1)[1]
    name = f"sb_prod_{secrets.token_hex(5)}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return _pg_url(admin_url, name)


def database_drop(url: str, admin_url: str = PG_ADMIN_URL) -> None:
    """Drop the database `url` names (only names this module made: `sb_prod_...`)."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    assert name.startswith("sb_prod_"), name
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_bin(tool: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))
    if not found:
        raise FileNotFoundError(f"PostgreSQL's {tool} is not installed under /usr/lib/postgresql")
    return str(found[-1])


@dataclass
class PostgresCluster:
    """A throwaway PostgreSQL cluster of our own (initdb as user postgres), stoppable at will."""

    root: Path
    port: int = 0

    def __post_init__(self) -> None:
        self.data = self.root / "data"
        self.sockets = self.root / "sock"

    def _as_postgres(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)

    def init(self) -> PostgresCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.sockets, "postgres", "postgres")
        self.port = self.port or free_port()
        self._as_postgres(
            pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8"
        )
        return self

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            "-c fsync=on -c shared_buffers=64MB"
        )
        self._as_postgres(
            pg_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.root / "pg.log"), "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`immediate` is a crash: no checkpoint, clients cut off)."""
        self._as_postgres(pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        out = subprocess.run(
            [pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True, timeout=10
        )
        return out.returncode == 0

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


# --- The hub ----------------------------------------------------------------------------------


@dataclass
class Registered:
    """A session registered through the API: its id, name, ref and token."""

    id: str
    name: str
    ref: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Hub:
    """The production topology as processes: web × N (daphne), worker, beat."""

    database_url: str
    redis_url: str
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    web_args: list[str] = field(default_factory=list)  # extra daphne options, e.g. --ping-timeout
    webs: list[Proc] = field(default_factory=list)
    web_urls: list[str] = field(default_factory=list)
    worker: Proc | None = None
    beat: Proc | None = None

    @property
    def env(self) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith("SWITCHBOARD_") or k in {"DATABASE_URL", "REDIS_URL"})
        }
        home = self.workdir / "home"
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        return {
            **base,
            "DJANGO_SETTINGS_MODULE": "hub.settings",
            "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "SWITCHBOARD_HOME": str(home),
            "SWITCHBOARD_SECRET_KEY": "sb-prod-secret-" + "s" * 40,
            "SWITCHBOARD_ENROLL_KEY": ENROLL_KEY,
            "SWITCHBOARD_SWEEP_SECONDS": "1",
            "SWITCHBOARD_TASK_LOG_LEVEL": "INFO",  # a line per finished task: tests read what ran
            "SWITCHBOARD_OUTBOUND_ALLOW": "127.0.0.1",  # the tests' gate hooks listen on loopback
            **self.extra_env,
        }

    def migrate(self) -> None:
        subprocess.run(
            [str(VENV_BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=REPO,
            env=self.env,
            check=True,
            timeout=180,
            capture_output=True,
        )

    def start_web(self, index: int | None = None, *, port: int = 0) -> str:
        """Start one web process (`switchboard web`: daphne on uvloop); return its base URL once it
        answers."""
        port = port or free_port()
        index = len(self.webs) if index is None else index
        proc = Proc(
            f"web{index}",
            [
                str(VENV_BIN / "switchboard"),
                "web",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "--http-timeout",
                "120",
                *self.web_args,
                "hub.asgi:application",
            ],
            {"SWITCHBOARD_DB_POOL": "8", **self.env},  # web processes pool their connections
            self.workdir / f"web{index}.log",
        ).start()
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if not proc.alive():
                raise RuntimeError(f"daphne exited:\n{proc.log()[-2000:]}")
            return httpx.get(f"{url}/api/openapi.json", timeout=2).status_code == 200

        wait_until(up, timeout=60, what=f"daphne web{index} on {url}", interval=0.1)
        if index < len(self.webs):
            self.webs[index], self.web_urls[index] = proc, url
        else:
            self.webs.append(proc)
            self.web_urls.append(url)
        return url

    def start_worker(self, *, concurrency: int = 2, argv_prefix: list[str] | None = None) -> Proc:
        """Start a Celery worker and wait until it says it is ready."""
        name = f"sbprod-{secrets.token_hex(3)}@%h"
        argv = (argv_prefix or [str(VENV_BIN / "celery")]) + [
            "-A",
            "hub",
            "worker",
            "-n",
            name,
            "-c",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        log = self.workdir / f"worker-{secrets.token_hex(2)}.log"
        proc = Proc("worker", argv, self.env, log).start()

        def ready() -> bool:
            if not proc.alive():
                raise RuntimeError(f"celery worker exited:\n{proc.log()[-2000:]}")
            return " ready." in proc.log()

        wait_until(ready, timeout=60, what="the celery worker", interval=0.1)
        self.worker = proc
        return proc

    def start_beat(self) -> Proc:
        proc = Proc(
            "beat",
            [
                str(VENV_BIN / "celery"),
                "-A",
                "hub",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(self.workdir / "beat-schedule"),
            ],
            self.env,
            self.workdir / "beat.log",
        ).start()
        wait_until(
            lambda: proc.alive() and "beat: Starting" in proc.log(),
            timeout=60,
            what="celery beat",
            interval=0.1,
        )
        self.beat = proc
        return proc

    def stop(self) -> None:
        for proc in [self.beat, self.worker, *self.webs]:
            if proc is not None:
                proc.stop()

    # --- talking to it -------------------------------------------------------------------------

    def client(self, web: int = 0, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.web_urls[web], timeout=kwargs.pop("timeout", 30), **kwargs)

    def register(self, name: str, *, web: int = 0, **fields: Any) -> Registered:
        with self.client(web) as c:
            r = c.post(
                "/api/v1/sessions",
                json={"name": name, **fields},
                headers={"Authorization": f"Bearer {ENROLL_KEY}"},
            )
        assert r.status_code == 201, r.text
        body = r.json()
        return Registered(id=body["id"], name=body["name"], ref=body["ref"], token=body["token"])

    def operator_token(self, name: str = "prod-operator") -> str:
        out = subprocess.run(
            [str(VENV_BIN / "python"), "manage.py", "operator_token", f"{name}-{secrets.token_hex(2)}"],
            cwd=REPO,
            env=self.env,
            check=True,
            timeout=60,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip().splitlines()[-1]

    def sql(self, query: str, *params: Any) -> list[tuple]:
        """Run one query against the hub's database and return the rows (for checks afterwards)."""
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(query, params or None)
            return cur.fetchall() if cur.description else []


def hub_start(
    *,
    database_url: str,
    redis_url: str,
    workdir: Path | None = None,
    webs: int = 2,
    worker: bool = True,
    beat: bool = True,
    extra_env: dict[str, str] | None = None,
    migrate: bool = True,
    web_args: list[str] | None = None,
) -> Hub:
    """Migrate (unless the database is already migrated), then start `webs` daphne processes, a
    worker and beat. Stops what started on failure."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="sb-prod-hub-"))
    hub = Hub(
        database_url=database_url,
        redis_url=redis_url,
        workdir=workdir,
        extra_env=extra_env or {},
        web_args=web_args or [],
    )
    try:
        if migrate:
            hub.migrate()
        for _ in range(webs):
            hub.start_web()
        if worker:
            hub.start_worker()
        if beat:
            hub.start_beat()
    except BaseException:
        hub.stop()
        raise
    return hub


@contextlib.contextmanager
def running_hub(**kwargs: Any) -> Iterator[Hub]:
    """A fresh database + private Redis + `hub_start(**kwargs)`, all torn down afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="sb-prod-"))
    redis = RedisServer(workdir).start()
    db_url = database_migrated()
    hub = None
    try:
        hub = hub_start(database_url=db_url, redis_url=redis.url(), workdir=workdir, migrate=False, **kwargs)
        yield hub
    finally:
        if hub:
            hub.stop()
        redis.stop()
        database_drop(db_url)
        shutil.rmtree(workdir, ignore_errors=True)


def rss_mb(pid: int) -> float:
    """Resident memory of one process, in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
