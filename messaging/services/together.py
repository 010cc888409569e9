"""Concurrent single sends, sent together: the hub's group commit for `POST /messages`.

Agents each sending now and then, a lead fanning out with parallel tool calls, a script with
several connections: a web process has single sends in flight at once, from one sender or many.
Each would run its own reads, rate-limit call, write and commit, and on SQLite queue for the one
writer. Here the first goes alone, a batch of one; the sends that arrive while it runs wait,
whoever sends them, and when it is done they go together through the send pipeline in one
transaction (`pipeline.messages_send`, which gives each the outcome it would have had on its own),
answered only after the lot is committed. Then the sends that arrived meanwhile go together in
turn, and so on. A send never waits while no group runs, so a hub with one send at a time sees
no difference.

One group runs at a time in a process (GROUPS_IN_FLIGHT), as a database flushes one group commit
at a time: a send waits at most for the group before it.

The waiting happens on the requests' own threads: the first request of a group runs the group on
its thread and database connection, and hands each of the others its outcome (or the error a
single send would have raised) before answering itself. A waiting request gives its pooled
database connection back meanwhile, so the requests arriving behind it can join the next group.
A failure of the whole group (the database going away) is every member's failure: none of them
was committed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

from messaging.services.pipeline import message_send, messages_send, outcomes_handed_over
from messaging.services.request import SendRequest
from messaging.services.sending import SendOutcome

GROUP_MAX = 100  # sends written together at most; the rest go in the next group
GROUPS_IN_FLIGHT = 1  # groups running at once in a process; a send waits only when all are busy


@dataclass
class _Waiting:
    """One request's send, waiting for its outcome or for a group to run."""

    request: SendRequest
    done: threading.Event = field(default_factory=threading.Event)
    outcome: SendOutcome | BaseException | None = None
    group: list[_Waiting] | None = None  # set when this request is to run the group itself

    def answer(self) -> SendOutcome:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome


class SendsTogether:
    """The groups running (at most `in_flight`), and the sends waiting for the next."""

    def __init__(self, *, group_max: int = GROUP_MAX, in_flight: int = GROUPS_IN_FLIGHT) -> None:
        self.group_max, self.in_flight = group_max, in_flight
        self._lock = threading.Lock()
        self._running = 0
        self._waiting: list[_Waiting] = []

    def send(self, request: SendRequest) -> SendOutcome:
        """Send `request` together with the other sends in flight; return or raise what
        `message_send` would."""
        mine = _Waiting(request)
        with self._lock:
            if self._running < self.in_flight:
                self._running += 1
                mine.group = [mine]
            else:
                self._waiting.append(mine)
        if mine.group is None:
            _database_connection_given_back()
            mine.done.wait()
        if mine.group is not None:  # this request runs its group (it came first, or was handed one)
            try:
                _run(mine.group)
            finally:
                self._hand_over()
        return mine.answer()

    def waiting(self) -> int:
        """How many sends wait for a group."""
        with self._lock:
            return len(self._waiting)

    def idle(self) -> bool:
        """True when no group runs and no send waits."""
        with self._lock:
            return not self._running and not self._waiting

    def _hand_over(self) -> None:
        """Start the next group with the sends that arrived meanwhile, on the first one's thread,
        or free the finished group's place."""
        with self._lock:
            if not self._waiting:
                self._running -= 1
                return
            group = self._waiting[: self.group_max]
            del self._waiting[: self.group_max]
        group[0].group = group
        group[0].done.set()


def _database_connection_given_back() -> None:
    """Hand this thread's pooled database connection back before a send waits for its group.
    The request took it to check its token; held idle while the group runs, it is one fewer for
    the sends arriving meanwhile, which need one to check theirs before they can join the next
    group. If this send is handed a group to run, it takes one again. Kept: a connection that is
    not pooled (SQLite keeps one per thread) or is in a transaction."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def _run(group: list[_Waiting]) -> None:
    """Send the group through the pipeline and give each its outcome."""
    outcomes: list[SendOutcome | BaseException]
    try:
        outcomes = list(messages_send([w.request for w in group]))
    except BaseException as exc:  # the group's failure (it committed nothing) is every member's
        outcomes = [exc] * len(group)
    if len(outcomes) != len(group):  # never expected; a member left without an outcome would hang
        fault = RuntimeError(f"a group of {len(group)} sends gave {len(outcomes)} outcomes")
        outcomes = [fault] * len(group)
    for waiting, outcome in zip(group, outcomes, strict=True):
        waiting.outcome = outcome
        if waiting is not group[0]:
            waiting.done.set()


_together = SendsTogether()


def message_send_together(request: SendRequest) -> SendOutcome:
    """`message_send(request)`, sent together with the other single sends in flight in this
    process when SWITCHBOARD_SEND_TOGETHER is on; otherwise alone."""
    if not settings.SWITCHBOARD_SEND_TOGETHER:
        return message_send(request)
    outcome = _together.send(request)
    outcomes_handed_over([outcome])  # on this request's thread, once its group is done
    return outcome
