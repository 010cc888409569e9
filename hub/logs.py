"""Logging filters the settings' LOGGING uses."""

from __future__ import annotations

import logging

BEAT_SEND = "Scheduler: Sending due task"


class BeatSendsBelow(logging.Filter):
    """Drops Celery beat's line per task sent ("Scheduler: Sending due task ...", at INFO) unless
    `level` (SWITCHBOARD_TASK_LOG_LEVEL) lets INFO through; beat's other lines pass. That line is
    told apart by its text only: beat logs its start and its errors on the same logger."""

    def __init__(self, level: str = "WARNING") -> None:
        super().__init__()
        shown = logging.getLevelName(level)  # a number for a known level's name
        self.shown = shown if isinstance(shown, int) else logging.WARNING

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.shown or not str(record.msg).startswith(BEAT_SEND)


LOG_FORMATS = ("plain", "json")
# Ids a log call may attach with `extra=`; nothing else of a record's extras is written, so a
# message's text or a token passed as an extra never reaches a collector.
JSON_EXTRA_FIELDS = ("message_id", "session_id", "delivery_id", "team_id", "task_id", "peer", "tier", "state")


class JsonLines(logging.Formatter):
    """One JSON object per line, for log collectors: time (UTC, ISO 8601), level, logger, the
    formatted line, the allowed ids a call attached (`JSON_EXTRA_FIELDS`), and the traceback of an
    exception. The line is the same one the plain format prints: the hub's log calls carry ids and
    counts, never message text or tokens."""

    def format(self, record: logging.LogRecord) -> str:
        from datetime import UTC, datetime

        import orjson

        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        for name in JSON_EXTRA_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode("utf-8")
