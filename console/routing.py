"""WebSocket routes. Browsers: session login + origin check. Agents: session token."""

from __future__ import annotations

from channels.routing import URLRouter

websocket_urlpatterns: list = []

websocket_application = URLRouter(websocket_urlpatterns)
