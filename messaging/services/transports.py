"""After a delivery is queued: wake whoever can hand it over fastest.

The database already holds the delivery, so each of these is a fast path; an inbox pull
always finds what they miss.
"""

from __future__ import annotations

from collections.abc import Iterable

from messaging.jobs import enqueue
from messaging.models import REMOTE_KIND, AgentSession
from messaging.plugins import PLUGINS
from messaging.services.events import Announcement, announce_many
from messaging.services.waiting import inbox_wake_up
from messaging.uds import UDS_PREFIX


def schedule_pushes(
    pushes: Iterable[tuple[int, AgentSession]], *, along_with: Iterable[Announcement] = ()
) -> None:
    """Once the transaction commits, tell each recipient's sockets (and long-polls) that its delivery
    is waiting, then start a socket write for a session that registered a local socket address, or
    a forward for an agent of another hub. The wake-ups go out in one hand-off with `along_with`
    (the rest of the caller's change), and before any write or forward starts: whatever a push
    leads to (a pull, a write, their `delivered` receipts) reaches no one ahead of the change's
    own events."""
    pushes = list(pushes)
    announce_many(
        [
            *(
                inbox_wake_up(delivery_id=delivery_id, recipient_id=recipient.id)
                for delivery_id, recipient in pushes
            ),
            *along_with,
        ]
    )
    for delivery_id, recipient in pushes:
        if recipient.kind == REMOTE_KIND:  # an agent of another hub: an operator released a hold for it
            PLUGINS.other_hubs.forward(delivery_id=delivery_id)
        elif recipient.peer_address.startswith(UDS_PREFIX):
            enqueue("messaging.tasks.deliver_to_socket", delivery_id)
