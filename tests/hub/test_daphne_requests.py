"""Daphne's requests skip Twisted's form parsing (hub/daphne_requests.py): daphne hands the
raw body to the application, which parses forms itself (the console's login form still works,
tests/e2e; every API body still arrives, the whole suite)."""

from __future__ import annotations

from typing import Any


class _Server:
    def protocol_connected(self, protocol: Any) -> None:
        pass


def _request() -> Any:
    """A request as daphne builds one for a new connection."""
    from daphne.http_protocol import HTTPFactory
    from twisted.internet.testing import StringTransport

    protocol = HTTPFactory(_Server()).buildProtocol(("127.0.0.1", 1))
    protocol.makeConnection(StringTransport())
    channel = protocol._channel  # the HTTP/1.1 channel behind Twisted's protocol switcher
    return channel.requestFactory(channel)


def test_the_asgi_application_makes_daphne_requests_skip_form_parsing() -> None:
    import hub.asgi  # noqa: F401 - importing the application applies it
    from hub.daphne_requests import bound_daphne_requests

    request = _request()

    assert request._parsePOSTFormSubmission is False
    assert bound_daphne_requests() is True  # applied once; asking again changes nothing
    assert type(_request()) is type(request)


def test_a_form_post_leaves_the_body_to_the_application() -> None:
    """What the flag changes in Twisted: a URL-encoded POST body is not read into `args`."""
    from io import BytesIO

    import hub.asgi  # noqa: F401

    request = _request()
    body = b"username=ada&password=secret"
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/x-www-form-urlencoded"])
    request.content = BytesIO(body)
    request.method, request.uri, request.clientproto = b"POST", b"/login/", b"HTTP/1.1"
    request.process = lambda: None  # daphne's own step, which would start the application
    request.requestReceived(b"POST", b"/login/", b"HTTP/1.1")

    assert request.args == {}
    assert request.content.getvalue() == body
