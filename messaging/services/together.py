"""A sender's concurrent single sends, sent together: group commit for `POST /messages`.

An agent that fans out (a lead messaging its teammates with parallel tool calls, a script with
several connections) has single sends in flight at once. Each would run its own reads, rate-limit
call and write. Here the first goes alone, by `message_send`, exactly as before; the sends of the
same sender that arrive while it runs wait, and when it is done they go together, as one
`messages_send_batch`, which gives each the outcome it would have had on its own (the batch's
promise) and answers only after the lot is committed. Then the sends that arrived meanwhile go
together in turn, and so on. A send never waits while nothing of its sender's is running, so an
agent that sends one message at a time sees no difference.

The waiting happens on the requests' own threads: the first request of a group runs the group on
its thread and database connection, and hands each of the others its outcome (or the error a
single send would have raised) before answering itself. A failure of the whole group (the
database going away) is every member's failure: none of them was committed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from messaging.models import AgentSession
from messaging.principals import Principal
from messaging.services.batch import BULK_FIELDS, messages_send_batch
from messaging.services.sending import SendOutcome, message_send

GROUP_MAX = 100  # sends of one sender written together at most; the rest go in the next group


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


class SendsTogether:
    """Per sender: whether a group is running, and the sends waiting for the next one."""

    def __init__(self, *, group_max: int = GROUP_MAX) -> None:
        self.group_max = group_max
        self._lock = threading.Lock()
        self._waiting: dict[Any, list[_Send]] = {}  # a key is present while its sender's group runs

    def send(self, *, sender: AgentSession, actor: Principal, fields: dict[str, Any]) -> SendOutcome:
        """Send `fields` (`message_send`'s keyword arguments, on the batch's path: BULK_FIELDS)
        for `sender`, together with the sender's other sends in flight; return or raise what
        `message_send` would."""
        mine = _Send(sender=sender, actor=actor, fields=fields)
        key = (sender.id, actor.actor)
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is None:
                self._waiting[key] = []
                mine.group = [mine]
            else:
                waiting.append(mine)
        if mine.group is None:
            mine.done.wait()
        if mine.group is not None:  # this request runs its group (it was first, or was handed one)
            try:
                _run(mine.group)
            finally:
                self._hand_over(key)
        return mine.answer()

    def _hand_over(self, key: Any) -> None:
        """Start the next group with the sends that arrived meanwhile, on the first one's thread."""
        with self._lock:
            waiting = self._waiting[key]
            if not waiting:
                del self._waiting[key]
                return
            group, waiting[:] = waiting[: self.group_max], waiting[self.group_max :]
        group[0].group = group
        group[0].done.set()


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
