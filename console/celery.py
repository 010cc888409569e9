"""The Celery app. In production it talks to Redis; embedded, jobs run in-process instead."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["messaging", "teams", "federation"])


@app.on_after_finalize.connect
def _install_periodic_jobs(sender: Celery, **_: object) -> None:
    from messaging.jobs import PERIODIC_JOBS

    for job in PERIODIC_JOBS:
        sender.add_periodic_task(job.every_seconds, sender.signature(job.task_name), name=job.task_name)
