"""What a send is asked to do: one message (`SendRequest`) and where it comes from (`Origin`).

Every caller of the send pipeline (`messaging.services.pipeline`) builds a request:
the API for an agent, the teams app for frames and notifications it writes on a session's
behalf, federation for a message another hub forwarded here. The rules that differ by caller read
the request's origin, never a flag of the caller's own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from messaging.models import AgentSession, MessageKind
from messaging.policy import HOST_VERIFIED
from messaging.principals import Principal
from messaging.services.decision import Decision

AGENT = "agent"
HUB = "hub"
FORWARDED = "forwarded"


class ForwardedContext(Protocol):
    """What a message another hub forwarded here carries (federation's `InboundContext`)."""

    @property
    def message_id(self) -> uuid.UUID | None:
        """The id the message takes on this hub (None: a new one)."""
        ...

    @property
    def tier(self) -> str: ...

    @property
    def trust(self) -> str: ...

    @property
    def vouched(self) -> bool:
        """True when this hub vouches for every hub key the message rests on (and its signature
        holds): only then may its address be anything but exact."""
        ...

    def adjust(self, decision: Decision, *, recipient: AgentSession, now: datetime) -> Decision:
        """The decision for a forwarded message, after this hub's standing with its origin."""
        ...


@dataclass(frozen=True)
class Origin:
    """Where a send comes from, and so which rules it follows:

    - an agent (AGENT, the default): every rule;
    - the hub, writing on a session's behalf (HUB: a notification with a final answer, a fired
      subscription, a team frame the hub sends): skips the sender's rate limits and the dedupe
      window, so it is never lost;
    - another hub (FORWARDED): trusted as the federation context says, never routed onward, its
      decision adjusted by the context (`ForwardedContext.adjust`), the files it carried scanned
      by their first bytes (`attached`); from a hub this hub does not vouch for, its address
      resolved only when it names a session exactly (`exact_address_only`)."""

    by: str = AGENT
    forwarded: ForwardedContext | None = None
    signature_failed: bool = False
    attached: tuple[bytes, ...] = ()

    @property
    def trust(self) -> str:
        """The trust the hub gives the sender before any other rule: host-verified for a local one."""
        return self.forwarded.trust if self.forwarded is not None else HOST_VERIFIED

    @property
    def hub_made(self) -> bool:
        return self.by == HUB

    @property
    def exact_address_only(self) -> bool:
        """True when the address must name a session exactly (id, ref, name, normalized name,
        `name [ref]`), never by a unique prefix: a message from a hub this hub does not vouch
        for. Read by the pipeline's one resolution of the address, so a hub nobody vouched for
        cannot reach (or list) this hub's agents a few letters at a time."""
        return self.forwarded is not None and not self.forwarded.vouched

    @classmethod
    def forwarded_by(
        cls, context: ForwardedContext, *, signature_failed: bool, attached: list[bytes]
    ) -> Origin:
        """The origin of a message another hub forwarded here."""
        return cls(
            by=FORWARDED, forwarded=context, signature_failed=signature_failed, attached=tuple(attached)
        )


AGENT_ORIGIN = Origin()
HUB_MADE = Origin(by=HUB)


@dataclass(frozen=True)
class SendRequest:
    """One message to send: `text` from `sender` to the session `to` names, as `actor` (the
    sender's own principal when None), with the fields of `POST /messages` and an origin."""

    sender: AgentSession
    to: str
    text: str
    actor: Principal | None = None
    summary: str = ""
    kind: str = MessageKind.TEXT
    frame_type: str = ""
    in_reply_to: str | None = None
    priority: str = "normal"
    idempotency_key: str | None = None
    files: list[dict[str, str]] | None = None  # uploaded files to attach ({sha256, name})
    origin: Origin = AGENT_ORIGIN
