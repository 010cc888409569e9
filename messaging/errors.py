"""One family of domain errors. Each carries a stable code, an HTTP status and a sentence.

The REST API, the MCP server, the CLI and the console map these to their own shapes; services
raise them and never build responses themselves.
"""

from __future__ import annotations

from typing import Any


class SwitchboardError(Exception):
    """Base of every error a caller can act on."""

    code = "error"
    status = 400

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}


class Invalid(SwitchboardError):
    """Bad input. `reason` says which rule it broke (empty_target, broadcast, ...)."""

    code = "invalid"
    status = 400

    def __init__(self, reason: str, detail: str, **extra: Any) -> None:
        super().__init__(detail, reason=reason, **extra)
        self.reason = reason


class TooLarge(SwitchboardError):
    code = "too_large"
    status = 413


class Unauthorized(SwitchboardError):
    code = "unauthorized"
    status = 401


class Forbidden(SwitchboardError):
    code = "forbidden"
    status = 403


class NotFound(SwitchboardError):
    code = "not_found"
    status = 404


class Ambiguous(SwitchboardError):
    code = "ambiguous"
    status = 409


class PinConflict(SwitchboardError):
    code = "pin_conflict"
    status = 409


class IdempotencyConflict(SwitchboardError):
    code = "idempotency_conflict"
    status = 409


class Conflict(SwitchboardError):
    code = "conflict"
    status = 409


class RateLimited(SwitchboardError):
    code = "rate_limited"
    status = 429


class HoldFull(SwitchboardError):
    code = "hold_full"
    status = 429


class Unavailable(SwitchboardError):
    code = "unavailable"
    status = 503
