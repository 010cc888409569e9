"""The hub's logging: quiet when all is well, loud when something fails."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys


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
    from hub.logs import BeatSendsBelow

    assert BeatSendsBelow("INFO").filter(_beat_record(logging.INFO, "Scheduler: Sending due task %s (%s)"))
    assert not BeatSendsBelow("no such level").filter(
        _beat_record(logging.INFO, "Scheduler: Sending due task")
    )


def _record_with(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "messaging.services", logging.WARNING, __file__, 1, "pushed %d events", (3,), None
    )
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_the_line_and_allowed_ids_but_no_other_extras() -> None:

    from hub.logs import JsonLines

    line = JsonLines().format(
        _record_with(message_id="m-1", session_id="s-1", text="a secret text", token="sb_sess_x")
    )
    body = json.loads(line)
    assert body["msg"] == "pushed 3 events"
    assert body["level"] == "WARNING" and body["logger"] == "messaging.services"
    assert body["message_id"] == "m-1" and body["session_id"] == "s-1"
    assert "a secret text" not in line and "sb_sess_x" not in line
    assert "\n" not in line


def test_json_lines_keep_a_traceback_on_one_line() -> None:

    from hub.logs import JsonLines

    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = _record_with()
        record.exc_info = sys.exc_info()
    line = JsonLines().format(record)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exc"]


def _hub_python(tmp_path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the hub's settings, a home of its own, JSON logs
    (unless `env` says otherwise) and no database or Redis from the test's environment."""
    environ = {
        **os.environ,
        "SWITCHBOARD_HOME": str(tmp_path),
        "SWITCHBOARD_LOG_FORMAT": "json",
        "DJANGO_SETTINGS_MODULE": "hub.settings",
        **env,
    }
    environ.pop("DATABASE_URL", None)
    environ.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60
    )


def test_the_log_format_setting_chooses_json_for_a_whole_process(tmp_path) -> None:
    out = _hub_python(
        tmp_path,
        "import django, logging; django.setup(); "
        "logging.getLogger('messaging').warning('hello %s', 'there', extra={'message_id': 'm-9'})",
    )
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stderr.strip().splitlines()[-1])
    assert body["msg"] == "hello there" and body["message_id"] == "m-9"
    refused = _hub_python(tmp_path, "import django; django.setup()", SWITCHBOARD_LOG_FORMAT="xml")
    assert refused.returncode != 0 and "SWITCHBOARD_LOG_FORMAT is plain or json" in refused.stderr


def test_a_celery_worker_logs_in_the_hub_format(tmp_path) -> None:
    # Celery sets up logging when a worker or beat starts; it must keep the hub's handlers, or
    # SWITCHBOARD_LOG_FORMAT=json gives Celery's plain lines there.
    out = _hub_python(
        tmp_path,
        "import django, logging; from hub.celery import app; django.setup(); "
        "app.log.setup(loglevel='WARNING', redirect_stdouts=True); "
        "logging.getLogger('messaging').warning('from a task', extra={'message_id': 'm-7'}); "
        "logging.getLogger('celery.app.trace').error('Task failed')",
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.strip().splitlines()]
    assert [(b["logger"], b["msg"]) for b in lines] == [
        ("messaging", "from a task"),
        ("celery.app.trace", "Task failed"),
    ]
    assert lines[0]["message_id"] == "m-7"
