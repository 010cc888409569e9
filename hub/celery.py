"""The Celery app. In production it talks to Redis; embedded, jobs run in-process instead."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.signals import (
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from celery.worker.consumer import Consumer as CeleryConsumer
from django.db import close_old_connections

from hub.heap import freeze_long_lived

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")

log = logging.getLogger(__name__)

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["messaging", "teams", "federation", "alerts"])


@setup_logging.connect
def _hub_logging_kept(**_: object) -> None:
    """Workers and beat log as the hub's other processes do, by settings.LOGGING (which
    django.setup() applied: SWITCHBOARD_LOG_FORMAT, _LOG_LEVEL, _TASK_LOG_LEVEL). A receiver of
    this signal keeps Celery from replacing those handlers with its own format and level."""


@worker_init.connect
@worker_process_init.connect
def _freeze_long_lived(**_: object) -> None:
    freeze_long_lived()  # a worker (or pool) process is ready: keep full GC passes short (hub.heap)


@worker_init.connect
def _database_connections_kept(**_: object) -> None:
    """A worker (and the pool processes it forks) keeps its PostgreSQL connection from one task
    to the next, for SWITCHBOARD_WORKER_DB_CONN_MAX_AGE seconds, checked before its first use in
    each task. Not when the connection age was set explicitly, nor with a connection pool."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if (
        database["ENGINE"] == "django.db.backends.postgresql"
        and not database.get("OPTIONS", {}).get("pool")
        and "SWITCHBOARD_DB_CONN_MAX_AGE" not in os.environ
    ):
        database["CONN_MAX_AGE"] = settings.SWITCHBOARD_WORKER_DB_CONN_MAX_AGE
        database["CONN_HEALTH_CHECKS"] = True


@task_prerun.connect
@task_postrun.connect
def _unusable_connections_closed(sender: Any = None, **_: object) -> None:
    """Between a worker's tasks, as between requests: drop a connection that failed (PostgreSQL
    restarted) or outlived its age, so the next task opens a fresh one instead of failing on it.
    A task run in the caller's process (`apply`: embedded mode, tests) is left to its caller."""
    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


@worker_init.connect
def _metrics_served(**_: object) -> None:
    """With SWITCHBOARD_WORKER_METRICS_PORT set, the worker serves its metrics (task run time, socket
    writes) over HTTP on SWITCHBOARD_WORKER_METRICS_HOST, added up over its pool processes when
    PROMETHEUS_MULTIPROC_DIR names a folder private to this worker (see docs/operations.md)."""
    from django.conf import settings

    port = settings.SWITCHBOARD_WORKER_METRICS_PORT
    if not port:
        return
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import REGISTRY

    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    start_http_server(port, addr=settings.SWITCHBOARD_WORKER_METRICS_HOST, registry=registry)
    log.info("worker metrics on http://%s:%d/metrics", settings.SWITCHBOARD_WORKER_METRICS_HOST, port)


@worker_process_shutdown.connect
def _metrics_of_a_pool_process_dropped(pid: int | None = None, **_: object) -> None:
    """A pool process that ends takes its live gauges with it (prometheus_client multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


_task_started: dict[str, float] = {}  # task id -> monotonic start, for the run-time histogram


@task_prerun.connect
def _task_timer_started(task_id: str = "", **_: object) -> None:
    import time

    _task_started[task_id] = time.monotonic()


@task_postrun.connect
def _task_timer_stopped(task_id: str = "", sender: Any = None, **_: object) -> None:
    """Every task's run time, worker or in-process alike, by task name (messaging.metrics)."""
    import time

    from messaging.metrics import TASK_SECONDS

    started = _task_started.pop(task_id, None)
    if started is not None:
        TASK_SECONDS.labels(getattr(sender, "name", "unknown")).observe(time.monotonic() - started)


@app.on_after_finalize.connect
def _install_periodic_jobs(sender: Celery, **_: object) -> None:
    from messaging.jobs import PERIODIC_JOBS

    for job in PERIODIC_JOBS:
        sender.add_periodic_task(job.every_seconds, sender.signature(job.task_name), name=job.task_name)


def broker_channels_lost(connection: Any) -> int:
    """Mark a lost connection's channels: they no longer push their unacknowledged messages back
    to the broker when closed, and acks for those messages are skipped. Return how many channels
    held unacknowledged messages.

    Why: both would go through the lost connection, and with kombu 5.7 both raise AttributeError
    there ('NoneType' object has no attribute 'hostname' / 'client'), which Celery 5.7 takes for an
    unrecoverable error: the worker stops consuming and never exits. On a lost Redis connection
    Celery runs `connection.collect()`, which stops closing channels at the first that fails (the
    remote-control channel deleting its fanout queue) and detaches the transport; `close()` then
    restores the task channel's unacknowledged (acks_late: running) task through the detached
    transport. And a task that finishes after the loss acks its message on the old, closed channel.
    Skipping both loses nothing: a reachable Redis keeps the message in its unacked set and
    redelivers it after the visibility timeout, an emptied Redis lost it anyway, and every task is
    idempotent with the database sweepers behind it."""
    transport = getattr(connection, "transport", None)
    holding = 0
    for channel in list(getattr(transport, "channels", None) or ()):
        qos = getattr(channel, "_qos", None)
        holding += bool(qos is not None and getattr(qos, "_delivered", None))
        channel.do_restore = False
        channel.basic_ack = channel.basic_reject = _not_acknowledged
    return holding


class Consumer(CeleryConsumer):
    """The worker's broker consumer (`CELERY_WORKER_CONSUMER`): survives losing Redis while a task
    is unacknowledged, instead of stopping for good (see `broker_channels_lost`)."""

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        if self.connection is not None and broker_channels_lost(self.connection):
            log.warning("broker lost with unacknowledged tasks: left to the broker and the sweepers")
        super().on_connection_error_after_connected(exc)


def _not_acknowledged(delivery_tag: object, *_: object, **__: object) -> None:
    """A lost channel's ack and reject: the message stays unacknowledged in the broker."""
    log.warning("not acknowledging task message %s: its broker connection was lost", delivery_tag)
