"""When each session was last seen, written a little late and many at a time.

Every authenticated REST call counts as a heartbeat (`AgentSession.last_seen`: the console calls
a live session that has not been seen for SWITCHBOARD_DEAD_AFTER_SECONDS dead). No request waits
for that write: an UPDATE and a commit in front of every answer would cost each call of an agent
that calls every few seconds, as agents do.

A call only notes the time in this process's `SeenTimes`, and a background thread writes
what was noted, at most once a second, for every session at once, in one transaction (rows in
id order, so two processes writing together cannot deadlock). A time never moves backwards:
a row keeps a later time another process or a status change wrote. What was noted but not yet
written is lost with the process, about a second of heartbeats, which the next call repeats.
In tests (SWITCHBOARD_JOBS=inline) the time is written at once, in the caller's transaction.

Explicit heartbeats, status changes and agent WebSockets write `last_seen` at once
(`sessions.session_touch`): they are rare, and their callers read the time back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from datetime import datetime

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from messaging.models import AgentSession

log = logging.getLogger(__name__)

SEEN_EVERY = 1.0  # seconds: a session's time is noted at most this often, and written this late at most
LATER = frozenset({"thread", "celery"})  # the job modes of a running hub; others (tests') write at once


def session_seen(session: AgentSession) -> None:
    """Record that an authenticated call came from `session` (see the module docstring); skipped
    when its `last_seen` is less than SEEN_EVERY old."""
    now = timezone.now()
    if session.last_seen and (now - session.last_seen).total_seconds() < SEEN_EVERY:
        return
    session.last_seen = now
    if settings.SWITCHBOARD_JOBS in LATER:
        seen_times().note(session.pk, now)
    else:
        seen_times_written({session.pk: now})


def seen_times_written(times: dict[uuid.UUID, datetime]) -> None:
    """Write `times` (session id → when seen) in one transaction, each only over an earlier time."""
    table = connection.ops.quote_name(AgentSession._meta.db_table)
    pk, last_seen = AgentSession._meta.pk, AgentSession._meta.get_field("last_seen")
    rows = []
    for session_id, at in sorted(times.items()):
        when = last_seen.get_db_prep_value(at, connection)
        rows.append([when, pk.get_db_prep_value(session_id, connection), when])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {table} SET last_seen = %s WHERE id = %s AND last_seen < %s", rows)


class SeenTimes:
    """This process's noted times, and the thread that writes them (started by `start`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._noted: dict[uuid.UUID, datetime] = {}
        self._due = threading.Event()
        self._failing = False  # the last write failed: its warning is logged, the next ones are not

    def start(self) -> SeenTimes:
        threading.Thread(target=self._run, name="switchboard-seen", daemon=True).start()
        return self

    def note(self, session_id: uuid.UUID, at: datetime) -> None:
        with self._lock:
            known = self._noted.get(session_id)
            if known is None or at > known:
                self._noted[session_id] = at
        self._due.set()

    def noted(self) -> dict[uuid.UUID, datetime]:
        """The times noted and not yet written."""
        with self._lock:
            return dict(self._noted)

    def write(self) -> int:
        """Write what is noted (on this thread's database connection); return how many sessions.
        On failure (the database away) the times are kept for the next round, unless a later
        one was noted meanwhile, and the failure is logged once per run of failures."""
        with self._lock:
            times, self._noted = self._noted, {}
        if not times:
            return 0
        try:
            seen_times_written(times)
        except Exception:
            if not self._failing:
                log.warning(
                    "could not write when %d sessions were last seen; will try again",
                    len(times),
                    exc_info=True,
                )
            self._failing = True
            for session_id, at in times.items():
                self.note(session_id, at)
            return 0
        self._failing = False
        return len(times)

    def _run(self) -> None:
        while True:
            self._due.wait()
            time.sleep(SEEN_EVERY)  # what else is noted meanwhile goes in the same write
            self._due.clear()
            try:
                close_old_connections()  # one PostgreSQL dropped goes; with a pool, one is taken
                self.write()
                close_old_connections()  # with a pool: handed back until the next round
            except Exception:  # closing a broken connection failed: the thread goes on regardless
                log.warning("the last-seen writer's database connection failed", exc_info=True)
                self._due.set()


_instance: SeenTimes | None = None
_instance_lock = threading.Lock()


def seen_times() -> SeenTimes:
    """This process's SeenTimes, its thread started on first use (again in a forked child)."""
    global _instance
    with _instance_lock:
        if _instance is None or _instance.pid != os.getpid():
            _instance = SeenTimes().start()
        return _instance
