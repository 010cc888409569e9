"""ASGI entry point: the REST API through its lean handler, other HTTP through Django's,
WebSockets through Channels (origin-checked)."""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from console.api_asgi import ApiHandler, is_api_request  # noqa: E402
from console.daphne_requests import skip_form_parsing  # noqa: E402
from console.heap import FreezeAfterWarmUp, freeze_long_lived  # noqa: E402
from console.routing import websocket_application  # noqa: E402

api_asgi_app = ApiHandler()
skip_form_parsing()  # daphne hands the body to Django, which parses forms itself


async def http_application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    app = api_asgi_app if is_api_request(scope) else django_asgi_app
    await app(scope, receive, send)


router = ProtocolTypeRouter({"http": http_application, "websocket": websocket_application})
warm_up = FreezeAfterWarmUp()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    warm_up.tick()
    await router(scope, receive, send)


freeze_long_lived()  # the application is built: keep full GC passes off its objects (console.heap)
