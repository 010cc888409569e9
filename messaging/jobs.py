"""Background jobs: where they run depends on the footprint, what they do does not.

`enqueue` is how services start background work. It waits for the transaction to commit, then:
  - "celery": sends the task to the broker (production: Redis, workers with acks_late);
  - "thread": runs it on the hub's in-process pool (embedded `switchboard serve`);
  - "inline": runs it right away in the calling thread (tests).
`PERIODIC_JOBS` is the one schedule: Celery beat reads it in production, the embedded scheduler
thread reads it in `switchboard serve`. Every job is idempotent and safe to run twice at once.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections, transaction
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

STATISTICS_SECONDS = 5  # how soon a fresh table's first planner statistics are gathered


@dataclass(frozen=True)
class PeriodicJob:
    task_name: str
    every_seconds: float


PERIODIC_JOBS: list[PeriodicJob] = [
    PeriodicJob("messaging.tasks.sweep_due_deliveries", settings.SWITCHBOARD_SWEEP_SECONDS),
    PeriodicJob("messaging.tasks.purge_audit", 3600),
    PeriodicJob("messaging.tasks.purge_expired", settings.SWITCHBOARD_PURGE_SECONDS),
    PeriodicJob("messaging.tasks.retry_socket_deliveries", settings.SWITCHBOARD_SOCKET_RETRY_SECONDS),
]
if connections["default"].vendor == "postgresql":  # messaging.services.statistics
    PERIODIC_JOBS.append(PeriodicJob("messaging.tasks.gather_planner_statistics", STATISTICS_SECONDS))

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _task(task_name: str) -> Any:
    from celery import current_app  # the project's app in every thread (Celery's Django fix-up)

    importlib.import_module(task_name.rsplit(".", 1)[0])  # registers the module's tasks
    return current_app.tasks[task_name]


def run_task_now(task_name: str, *args: Any) -> None:
    """Run a task body in this thread (embedded pool and tests), logging instead of raising."""
    close_old_connections()
    try:
        _task(task_name).apply(args=args, throw=True)
    except Exception:
        log.exception("background job %s failed", task_name)
    finally:
        close_old_connections()


def _submit(task_name: str, args: tuple[Any, ...]) -> None:
    mode = settings.SWITCHBOARD_JOBS
    if mode == "celery":
        try:
            _task(task_name).apply_async(args=args)
        except OperationalError:
            # The broker stayed unreachable through the publish retries. Every job started here is
            # a fast path for work the database already holds, which the periodic sweepers drive
            # again; raising would turn a committed send into a 500 and skip the transaction's
            # later on-commit jobs.
            log.warning("broker unavailable: %s%r left to the sweepers", task_name, args)
    elif mode == "inline":
        run_task_now(task_name, *args)
    else:
        _thread_pool().submit(run_task_now, task_name, *args)


def enqueue(task_name: str, *args: Any) -> None:
    """Start `task_name(*args)` in the background once the current transaction commits. Only for
    work the database holds and a periodic job drives again: with the broker down it is skipped."""
    transaction.on_commit(lambda: _submit(task_name, args))


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="switchboard-job")
        return _pool


class EmbeddedScheduler:
    """Runs PERIODIC_JOBS on a daemon thread: the in-process stand-in for Celery beat."""

    def __init__(self, jobs: list[PeriodicJob] | None = None, *, run: Callable[[str], None] | None = None):
        self.jobs = jobs if jobs is not None else PERIODIC_JOBS
        self._run = run or (lambda name: run_task_now(name))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="switchboard-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_seconds: float = 0.0) -> None:
        """Stop scheduling; with `wait_seconds`, also wait up to that long for a job under way to end."""
        self._stop.set()
        if wait_seconds > 0 and self._thread.is_alive():
            self._thread.join(wait_seconds)

    def _loop(self) -> None:
        next_run = {job.task_name: time.monotonic() for job in self.jobs}
        while not self._stop.is_set():
            now = time.monotonic()
            for job in self.jobs:
                if now >= next_run[job.task_name]:
                    self._run(job.task_name)
                    next_run[job.task_name] = now + job.every_seconds
            wake = min(next_run.values()) - time.monotonic()
            self._stop.wait(max(0.05, min(wake, 1.0)))
