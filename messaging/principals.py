"""Who is calling: a session (acts as itself only) or an operator (a human; approves, sets policy)."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass

from messaging.errors import Forbidden
from messaging.models import AgentSession


@dataclass(frozen=True)
class Principal:
    kind: str  # "session" | "operator" | "hub"
    session: AgentSession | None = None
    operator_name: str = ""

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"

    @property
    def actor(self) -> str:
        """How this caller is named in the audit."""
        if self.kind == "session" and self.session is not None:
            return f"session:{self.session.name} [{self.session.ref}]"
        if self.kind == "operator":
            return f"operator:{self.operator_name}"
        return "hub"

    def is_self_or_operator(self, session: AgentSession) -> bool:
        """True when this caller is `session` itself or an operator: who may act on a session's
        own settings and registrations."""
        return self.is_operator or (self.session is not None and self.session.id == session.id)

    def require_session(self) -> AgentSession:
        if self.kind != "session" or self.session is None:
            raise Forbidden("This call acts as an agent session; use a session token.")
        return self.session

    def require_operator(self) -> None:
        if not self.is_operator:
            raise Forbidden(
                "Only an operator (a human, with a console login or operator token) may do this. "
                "A message or a session token is never consent."
            )


HUB = Principal(kind="hub")


def session_principal(session: AgentSession) -> Principal:
    return Principal(kind="session", session=session)


def operator_principal(name: str) -> Principal:
    return Principal(kind="operator", operator_name=name)


def command_line_operator() -> Principal:
    """Whoever runs a management command on the hub's machine: an operator named after their
    account there (`operator:manage.py:<user>` in the audit), never the hub itself."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # an account with no name (a container's bare uid)
        user = f"uid-{os.getuid()}"
    return operator_principal(f"manage.py:{user}")
