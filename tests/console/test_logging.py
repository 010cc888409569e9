"""The hub's logging: quiet when all is well, loud when something fails."""

from __future__ import annotations

import logging


def test_finished_tasks_are_not_logged_but_failed_ones_are() -> None:
    # The embedded scheduler runs the periodic sweeps every second or few: a line for each
    # finished one flooded `switchboard serve`'s terminal (Celery logs a failure at ERROR).
    trace = logging.getLogger("celery.app.trace")
    assert not trace.isEnabledFor(logging.INFO)
    assert trace.isEnabledFor(logging.ERROR)


def test_the_worker_does_not_log_each_task_it_takes() -> None:
    strategy = logging.getLogger("celery.worker.strategy")  # "Task ... received"
    assert not strategy.isEnabledFor(logging.INFO)
    assert strategy.isEnabledFor(logging.ERROR)


def _beat_record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("celery.beat", level, __file__, 1, message, None, None)


def test_beat_logs_its_start_and_its_errors_but_not_each_task_it_sends() -> None:
    beat = logging.getLogger("celery.beat")
    assert not beat.filter(_beat_record(logging.INFO, "Scheduler: Sending due task %s (%s)"))
    assert beat.filter(_beat_record(logging.INFO, "beat: Starting..."))
    assert beat.filter(_beat_record(logging.ERROR, "Message Error: %s\n%s"))


def test_asking_for_each_task_brings_the_lines_back() -> None:
    from console.logs import BeatSendsBelow

    assert BeatSendsBelow("INFO").filter(_beat_record(logging.INFO, "Scheduler: Sending due task %s (%s)"))
    assert not BeatSendsBelow("no such level").filter(
        _beat_record(logging.INFO, "Scheduler: Sending due task")
    )
