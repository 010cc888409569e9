"""The points where the apps above `messaging` plug in.

`messaging` is the ground floor: it imports no other app. Where one of its rules needs what a
higher app knows, it asks through a point declared here, and that app registers its answer in its
`AppConfig.ready` (`teams`: the `lead` alias, the observers' send guard, what a status change
causes for a team; `federation`: agents of other hubs, attached files, the machine's registry;
`console`: the page where an operator reads a message).
Each point has a default that holds on a hub where nothing registered on it.

Points that answer (a route, a guard's verdict, a name) are attributes of `PLUGINS`; points that
only tell whoever cares (a session registered, a status changed) are Django signals, sent inside
the service's transaction so a listener's writes commit or roll back with the change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from django.dispatch import Signal

if TYPE_CHECKING:
    from messaging.addressing import Resolution
    from messaging.models import AgentSession, Delivery


class RemoteSend(Protocol):
    """How a send reaches an agent another hub hosts (federation's answer to `OtherHubs.route`)."""

    recipient: AgentSession  # the local stand-in session of the remote agent
    resolution: Resolution

    @property
    def tier(self) -> str: ...

    def decide(self, *, sender: AgentSession, text: str, kind: str, now: Any) -> Any: ...

    def attach(self, delivery: Delivery) -> None: ...


class OtherHubs(Protocol):
    """Routing beyond this hub: agents that other hubs host, and the hubs themselves."""

    def route(self, *, sender: AgentSession, target: str) -> RemoteSend | None:
        """Where `target` goes when no local session takes it; None when no other hub does."""
        ...

    def hub_name(self, session_id: Any, *, vouched: bool) -> str:
        """The name a remote stand-in session's hub is shown by (FROM_HUB)."""
        ...

    def agents(self, *, name: str | None) -> list[dict[str, Any]]:
        """Agents other hubs host (for the directory), each with its tier."""
        ...

    def progress(self, *, delivery_ids: list[int]) -> dict[int, dict[str, Any]]:
        """What the other hubs last reported for deliveries handed to them, by delivery id."""
        ...

    def live_elsewhere(self, *, name_key: str, cwd: str) -> str | None:
        """The name of another hub on this machine where this agent (name and folder) is live."""
        ...

    def forward(self, *, delivery_id: int) -> None:
        """Start handing a queued delivery to the hub hosting its recipient, once the current
        transaction commits (a remote stand-in session's delivery: a released hold)."""
        ...

    def hand_over(self, *, delivery_ids: list[int]) -> None:
        """Hand deliveries a send just relayed (and committed) over where the send's answer
        depends on it, before the sender is answered: afterwards each one's state says what became
        of it (still `relayed`, or `failed` with its reason). Called on the sender's own thread."""
        ...


class ThisHubOnly:
    """No other hub: nothing is routed away, nothing is hosted elsewhere."""

    def route(self, *, sender: AgentSession, target: str) -> RemoteSend | None:
        return None

    def hub_name(self, session_id: Any, *, vouched: bool) -> str:
        return "unknown"

    def agents(self, *, name: str | None) -> list[dict[str, Any]]:
        return []

    def progress(self, *, delivery_ids: list[int]) -> dict[int, dict[str, Any]]:
        return {}

    def live_elsewhere(self, *, name_key: str, cwd: str) -> str | None:
        return None

    def forward(self, *, delivery_id: int) -> None:
        return None

    def hand_over(self, *, delivery_ids: list[int]) -> None:
        return None


class SendGuard(Protocol):
    """A rule on who may send what to whom, for sessions it restricts (teams: observers).

    `restricted_sql` is an SQL condition with one `%s` (a session id), true when the guard
    restricts that session: the send path reads it with the pair's other facts in one query, and
    calls `check` only when either side is restricted."""

    restricted_sql: str

    def check(self, *, sender: AgentSession, recipient: AgentSession, kind: str) -> str | None:
        """Raise a SwitchboardError to refuse the send; else the trust marker the message carries
        (None: the usual one)."""
        ...


class NoGuard:
    """Nobody is restricted (the condition is false for every id)."""

    restricted_sql = "(%s IS NULL)"

    def check(self, *, sender: AgentSession, recipient: AgentSession, kind: str) -> str | None:
        return None


class Attachments(Protocol):
    """Files that travel with a message."""

    table: str  # the table of (message_id, ...) rows: a message carries files when it has one

    def head(self, *, sha256: str, holder_id: Any) -> bytes:
        """The start of a file `holder_id` holds (uploaded, or received), for the sensitive tier
        to scan its send; empty for any other, so a file the sender cannot attach changes nothing."""
        ...

    def attach(self, *, message_id: Any, sender_id: Any, files: list[dict[str, str]], tier: str) -> None:
        """Attach files the sender holds (uploaded, or received) to a message being written
        (raises before keeping anything)."""
        ...

    def deliver(self, *, message_id: Any, recipient_id: Any) -> list[dict[str, Any]]:
        """Hand a message's files to its recipient (idempotent) and list them."""
        ...

    def carrying(self, *, message_ids: list[Any]) -> set[Any]:
        """Which of these messages carry files."""
        ...


class NoAttachments:
    """Messages carry no files: sending one is refused."""

    table = ""

    def head(self, *, sha256: str, holder_id: Any) -> bytes:
        return b""

    def attach(self, *, message_id: Any, sender_id: Any, files: list[dict[str, str]], tier: str) -> None:
        from messaging.errors import Invalid

        raise Invalid("files_unsupported", "This hub takes no files.")

    def deliver(self, *, message_id: Any, recipient_id: Any) -> list[dict[str, Any]]:
        return []

    def carrying(self, *, message_ids: list[Any]) -> set[Any]:
        return set()


def _no_lead(session: AgentSession) -> AgentSession | None:
    return None


def _no_message_page(message_id: Any) -> str | None:
    return None


@dataclass
class PlugIns:
    """What the apps above registered (see the module's docstring); one instance, `PLUGINS`."""

    other_hubs: OtherHubs = field(default_factory=ThisHubOnly)
    send_guard: SendGuard = field(default_factory=NoGuard)
    attachments: Attachments = field(default_factory=NoAttachments)
    # The session the reserved address `lead` means for a sender (None: it means nobody).
    lead_of: Any = _no_lead
    # The address of the page where an operator reads a message whole, a sensitive one's secrets
    # revealed and the reveal audited (None: there is no such page; the admin links nowhere).
    message_page: Any = _no_message_page


PLUGINS = PlugIns()

# Sent inside the registering transaction: `session` (just created; `session.status` is busy, idle
# or stopped).
session_registered = Signal()

# Sent inside `session_set_status`'s transaction after the row is saved: `session`, `previous`
# (its status before, possibly the same), `final_answer` (str or None), `actor` (a Principal).
session_status_changed = Signal()
