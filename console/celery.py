"""The Celery app. In production it talks to Redis; embedded, jobs run in-process instead."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer as CeleryConsumer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

log = logging.getLogger(__name__)

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["messaging", "teams", "federation"])


@app.on_after_finalize.connect
def _install_periodic_jobs(sender: Celery, **_: object) -> None:
    from messaging.jobs import PERIODIC_JOBS

    for job in PERIODIC_JOBS:
        sender.add_periodic_task(job.every_seconds, sender.signature(job.task_name), name=job.task_name)


def broker_skip_restore(connection: Any) -> int:
    """Stop the lost connection's channels from pushing their unacknowledged messages back to the
    broker when they are closed; return how many channels held some.

    Why: on a lost Redis connection Celery 5.7 runs `connection.collect()` and then
    `connection.close()`. With Redis gone, collect() stops closing channels at the first one that
    fails (the remote-control channel deleting its fanout queue), detaches the transport, and
    leaves the task channel open; close() then makes kombu restore that channel's unacknowledged
    task (acks_late: the one running) through the detached transport, which raises AttributeError.
    Celery takes that for an unrecoverable error: the worker stops consuming and never exits.
    Skipping the restore loses nothing: a reachable Redis keeps the message in its unacked set and
    redelivers it after the visibility timeout, and a restarted, empty Redis had lost it anyway;
    every task is idempotent and the database sweepers drive the work again."""
    transport = getattr(connection, "transport", None)
    holding = 0
    for channel in list(getattr(transport, "channels", None) or ()):
        qos = getattr(channel, "_qos", None)
        holding += bool(qos is not None and getattr(qos, "_delivered", None))
        channel.do_restore = False
    return holding


class Consumer(CeleryConsumer):
    """The worker's broker consumer (`CELERY_WORKER_CONSUMER`): survives losing Redis while a task
    is unacknowledged, instead of stopping for good."""

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        if self.connection is not None and broker_skip_restore(self.connection):
            log.warning("broker lost with unacknowledged tasks: left to the broker and the sweepers")
        super().on_connection_error_after_connected(exc)
