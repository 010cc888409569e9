"""The hub's logging: quiet when all is well, loud when something fails."""

from __future__ import annotations

import logging


def test_finished_tasks_are_not_logged_but_failed_ones_are() -> None:
    # The embedded scheduler runs the periodic sweeps every second or few: a line for each
    # finished one flooded `switchboard serve`'s terminal (Celery logs a failure at ERROR).
    trace = logging.getLogger("celery.app.trace")
    assert not trace.isEnabledFor(logging.INFO)
    assert trace.isEnabledFor(logging.ERROR)
