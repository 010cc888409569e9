"""WebSocket routes. Browsers: session login + origin check. Agents: session token."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from console.consumers import OperatorConsumer
from messaging.consumers import AgentConsumer

websocket_urlpatterns: list = [
    # The operator console: a browser, so the origin must be one of ALLOWED_HOSTS and the
    # Django session cookie must belong to a staff user (checked in the consumer).
    path("ws/console/", AllowedHostsOriginValidator(AuthMiddlewareStack(OperatorConsumer.as_asgi()))),
    # Agents are not browsers (no cookies, often no Origin): the session token, sent in a header
    # or the first frame, is checked in the consumer.
    path("ws/agent/", AgentConsumer.as_asgi()),
]

websocket_application = URLRouter(websocket_urlpatterns)
