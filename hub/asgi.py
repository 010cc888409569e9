"""ASGI entry point: every request checked for its Host and body size (hub.request_guard),
then the REST API through its lean handler, other HTTP through Django's, WebSockets through
Channels (origin-checked)."""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from hub.api_asgi import ApiHandler, app_path, is_api_request  # noqa: E402
from hub.daphne_requests import bound_daphne_requests  # noqa: E402
from hub.heap import FreezeAfterWarmUp, freeze_long_lived  # noqa: E402
from hub.request_guard import RequestGuard  # noqa: E402
from hub.routing import websocket_application  # noqa: E402

api_asgi_app = ApiHandler()
bound_daphne_requests()  # daphne: body limits while receiving, bodies fed as read, no form parsing


async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
    app = api_asgi_app if is_api_request(scope) else django_asgi_app
    await app(scope, receive, send)


# Every HTTP request, whichever handler serves it, passes the Host and body-size checks first.
http_application = RequestGuard(dispatch, app_path)
router = ProtocolTypeRouter({"http": http_application, "websocket": websocket_application})
warm_up = FreezeAfterWarmUp()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    warm_up.tick()
    await router(scope, receive, send)


freeze_long_lived()  # the application is built: keep full GC passes off its objects (hub.heap)
