"""WebSocket routes. Browsers: session login + same-origin check. Agents: session token."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path

from console.consumers import OperatorConsumer
from hub.request_guard import WebSocketGuard
from messaging.consumers import AgentConsumer

websocket_urlpatterns: list = [
    # The operator console: a browser authenticated by its cookie, so the Origin must be the hub's
    # own (scheme, host and port) and the Django session must belong to a staff user (checked in
    # the consumer).
    path(
        "ws/console/",
        WebSocketGuard(AuthMiddlewareStack(OperatorConsumer.as_asgi()), origin_required=True),
    ),
    # Agents are not browsers (no cookies, often no Origin): the session token, sent in a header
    # or the first frame, is checked in the consumer. A handshake that does carry an Origin comes
    # from a page, which must be the hub's own.
    path("ws/agent/", WebSocketGuard(AgentConsumer.as_asgi(), origin_required=False)),
]

websocket_application = URLRouter(websocket_urlpatterns)
