"""After a delivery is queued: wake whoever can hand it over fastest.

The database already holds the delivery, so each of these is a fast path; an inbox pull
always finds what they miss.
"""

from __future__ import annotations

from messaging.jobs import enqueue
from messaging.models import AgentSession
from messaging.services.events import announce

UDS_PREFIX = "uds:"


def schedule_push(delivery_id: int, recipient: AgentSession) -> None:
    """Tell the recipient's sockets (and long-polls) a delivery is waiting; start a socket write
    when the session registered a local socket address."""
    announce(
        "inbox.queued",
        {"delivery_id": delivery_id, "recipient_id": str(recipient.id)},
        sessions=[recipient.id],
        operators=False,
    )
    if recipient.kind == "remote":  # an agent of another hub: an operator released a hold for it
        enqueue("federation.tasks.forward_delivery", delivery_id)
        return
    if recipient.peer_address.startswith(UDS_PREFIX):
        enqueue("messaging.tasks.deliver_to_socket", delivery_id)
