"""Federation's domain errors: the same family as messaging's, with their own codes."""

from __future__ import annotations

from messaging.errors import SwitchboardError


class HopLimit(SwitchboardError):
    code = "hop_limit"
    status = 400


class PeerRevoked(SwitchboardError):
    code = "peer_revoked"
    status = 403


class PeerUnknown(SwitchboardError):
    """A hub key nobody vouched for, while SWITCHBOARD_PEER_TOFU is off."""

    code = "peer_unknown"
    status = 403


class LeaseHeld(SwitchboardError):
    code = "lease_held"
    status = 409


class LeaseStatementRefused(SwitchboardError):
    """A relay lease asked for without the leasing hub's signed statement, or with one that does
    not hold (`signatures.lease_statement_problem`): senders could not believe it, so it is not
    taken."""

    code = "bad_lease_statement"
    status = 400


class RelayQuotaFull(SwitchboardError):
    """A hub key already keeps as many items, or bytes, waiting at this relay as one key may."""

    code = "relay_quota"
    status = 429


class NotRelay(SwitchboardError):
    code = "not_relay"
    status = 404


class TransientError(Exception):
    """A hub could not be reached or answered 5xx/429: try again later. When it answered,
    `status` and `body` say how (the caller may know a 429 that waiting will not cure)."""

    def __init__(self, message: str, *, status: int | None = None, body: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Unreachable(TransientError):
    """Nothing answered at the hub's address (connection refused or no route)."""


class UnverifiedAnswer(TransientError):
    """Something answered at the hub's address, but not as that hub: the answer is not signed by
    the key the request was signed for, or not for that request (`answer_problem`). Taken as no
    answer: its status and body are nobody's word, so `status` and `body` stay None."""

    def __init__(self, message: str, *, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


class RelayKeyChanged(TransientError):
    """The relay's URL answered with another key than the one it had when this hub first used it
    (`keys.relay_key`): nothing is sent there, nor taken from there, until an operator configures
    the relay's key."""


class PermanentError(Exception):
    """A hub answered in a way that retrying won't change (4xx). `status` and `body` say how."""

    def __init__(self, status: int, body: object) -> None:
        super().__init__(f"HTTP {status}: {body!r}"[:400])
        self.status = status
        self.body = body


class BadRequestSignature(SwitchboardError):
    """A hub request whose signature headers are missing, malformed, stale, for another hub, or
    do not verify."""

    code = "bad_request_signature"
    status = 401


class ReplayedRequest(SwitchboardError):
    """A hub request whose nonce this hub has already seen inside the time window."""

    code = "replayed_request"
    status = 401
