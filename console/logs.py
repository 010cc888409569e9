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
