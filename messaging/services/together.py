"""A sender's concurrent single sends, sent together: group commit for `POST /messages`.

An agent that fans out (a lead messaging its teammates with parallel tool calls, a script with
several connections) has single sends in flight at once. Each would run its own reads, rate-limit
call and write. Here the first goes alone, by `message_send`, exactly as before; the sends of the
same sender that arrive while it runs wait, and when it is done they go together, as one
`messages_send_batch`, which gives each the outcome it would have had on its own (the batch's
promise) and answers only after the lot is committed. Then the sends that arrived meanwhile go
together in turn, and so on. A send never waits while nothing of its sender's is running, so an
agent that sends one message at a time sees no difference.

One group of a sender runs at a time (GROUPS_IN_FLIGHT), as a database flushes one group commit
at a time. Under load that is the saving: in-process, with 8 threads of one sender, a send cost
about a third of the CPU in this process and in PostgreSQL, and twice as many went through
(`bench/sends_together.py`). On an idle hub a sender with a few sends in flight waits a little
for them instead: with 4 threads, 0.90-0.96x the sends per second, for three quarters of the CPU.

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
from typing import Any

from django.conf import settings
from django.db import connection

from messaging.models import AgentSession
from messaging.principals import Principal
from messaging.services.batch import BULK_FIELDS, messages_send_batch
from messaging.services.sending import SendOutcome, message_send

GROUP_MAX = 100  # sends of one sender written together at most; the rest go in the next group
GROUPS_IN_FLIGHT = 1  # groups of one sender running at once; a send waits only when all are busy


@dataclass
class _Send:
    """One request's send, waiting for its outcome or for a group to run."""

    sender: AgentSession
    actor: Principal
    fields: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    outcome: SendOutcome | BaseException | None = None
    group: list[_Send] | None = None  # set when this request is to run the group itself

    def answer(self) -> SendOutcome:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome


@dataclass
class _Sender:
    """One sender's groups running, and its sends waiting for a group."""

    running: int = 0
    waiting: list[_Send] = field(default_factory=list)


class SendsTogether:
    """Per sender: the groups running (at most `in_flight`), and the sends waiting for the next."""

    def __init__(self, *, group_max: int = GROUP_MAX, in_flight: int = GROUPS_IN_FLIGHT) -> None:
        self.group_max, self.in_flight = group_max, in_flight
        self._lock = threading.Lock()
        self._senders: dict[Any, _Sender] = {}  # present while a group of the sender's runs

    def send(self, *, sender: AgentSession, actor: Principal, fields: dict[str, Any]) -> SendOutcome:
        """Send `fields` (`message_send`'s keyword arguments, on the batch's path: BULK_FIELDS)
        for `sender`, together with the sender's other sends in flight; return or raise what
        `message_send` would."""
        mine = _Send(sender=sender, actor=actor, fields=fields)
        key = (sender.id, actor.actor)
        with self._lock:
            state = self._senders.setdefault(key, _Sender())
            if state.running < self.in_flight:
                state.running += 1
                mine.group = [mine]
            else:
                state.waiting.append(mine)
        if mine.group is None:
            _database_connection_given_back()
            mine.done.wait()
        if mine.group is not None:  # this request runs its group (it came first, or was handed one)
            try:
                _run(mine.group)
            finally:
                self._hand_over(key)
        return mine.answer()

    def waiting(self, key: Any) -> int:
        """How many sends of `key` (sender id, actor) wait for a group."""
        with self._lock:
            state = self._senders.get(key)
            return len(state.waiting) if state else 0

    def idle(self) -> bool:
        """True when no group runs and no send waits."""
        with self._lock:
            return not self._senders

    def _hand_over(self, key: Any) -> None:
        """Start the next group with the sends that arrived meanwhile, on the first one's thread,
        or free the finished group's place."""
        with self._lock:
            state = self._senders[key]
            if not state.waiting:
                state.running -= 1
                if not state.running:
                    del self._senders[key]
                return
            group = state.waiting[: self.group_max]
            del state.waiting[: self.group_max]
        group[0].group = group
        group[0].done.set()


def _database_connection_given_back() -> None:
    """Hand this thread's pooled database connection back before a send waits for its group.
    The request took it to check its token; held idle while the group runs, it is one fewer for
    the sends arriving meanwhile, which need one to check theirs before they can join the next
    group (with one web process's pool of 8 and 16 sends of one sender in flight, a tenth of the
    requests' time went to waiting for a connection). If this send is handed a group to run, it
    takes one again. Kept: a connection that is not pooled (SQLite keeps one per thread) or is
    in a transaction."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def _run(group: list[_Send]) -> None:
    """Send the group (one alone by `message_send`, more as a batch) and give each its outcome."""
    first = group[0]
    outcomes: list[SendOutcome | BaseException]
    try:
        if len(group) == 1:
            outcomes = [message_send(sender=first.sender, actor=first.actor, **first.fields)]
        else:
            items = [s.fields for s in group]
            outcomes = list(messages_send_batch(sender=first.sender, items=items, actor=first.actor))
    except BaseException as exc:  # a single send's own error, or the batch's (it committed nothing)
        outcomes = [exc] * len(group)
    if len(outcomes) != len(group):  # never expected; a member left without an outcome would hang
        fault = RuntimeError(f"a batch of {len(group)} sends gave {len(outcomes)} outcomes")
        outcomes = [fault] * len(group)
    for send, outcome in zip(group, outcomes, strict=True):
        send.outcome = outcome
        if send is not first:
            send.done.set()


_together = SendsTogether()


def message_send_together(*, sender: AgentSession, actor: Principal, **fields: Any) -> SendOutcome:
    """`message_send(sender=..., actor=..., **fields)`, sent together with the sender's other
    single sends in flight when the fields are ones a batch takes (no attached files) and
    SWITCHBOARD_SEND_TOGETHER is on; otherwise alone."""
    if not settings.SWITCHBOARD_SEND_TOGETHER or fields.get("files") or not BULK_FIELDS.issuperset(fields):
        return message_send(sender=sender, actor=actor, **fields)
    return _together.send(sender=sender, actor=actor, fields=fields)
