"""Daphne's HTTP requests without Twisted's form parsing.

Twisted's `Request` parses the body of every POST that carries a Content-Type into
`request.args` (URL-encoded and multipart forms), and to learn the type it builds an
`email.message.Message` per request. Daphne never reads `request.args`: it hands the raw body to
the ASGI application, where Django parses forms itself. py-spy put that parsing at about 5% of a
web process's CPU per `POST /api/v1/messages`. Twisted lets a request skip it
(`parsePOSTFormSubmission=False`, a documented argument of `twisted.web.http.Request`); daphne
has no setting for it, so this gives daphne's request class that argument.
"""

from __future__ import annotations

import inspect
from typing import Any


def skip_form_parsing() -> bool:
    """Make daphne's requests skip Twisted's form parsing; True if it applies (once per process).
    Does nothing with a Twisted whose `Request` does not take the argument."""
    from daphne import http_protocol
    from twisted.web.http import Request

    if getattr(http_protocol.WebRequest, "skips_form_parsing", False):
        return True
    if "parsePOSTFormSubmission" not in inspect.signature(Request.__init__).parameters:
        return False

    class WebRequest(http_protocol.WebRequest):
        skips_form_parsing = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("parsePOSTFormSubmission", False)
            super().__init__(*args, **kwargs)

    # HTTPFactory.buildProtocol names the class through the module, on every new connection.
    http_protocol.WebRequest = WebRequest
    return True
