"""The operator's WebSocket: a logged-in staff browser joins the `operators` group and receives
every `hub.event` the services publish there. It only listens; decisions go through CSRF-checked
POSTs, so nothing arriving on a socket can approve anything."""

from __future__ import annotations

from typing import Any

from messaging.consumers import LoopConsumer
from messaging.services.events import OPERATORS_GROUP

# Close codes in the 4000 range are ours: the browser shows them and stops retrying on 4403.
CLOSE_FORBIDDEN = 4403


def is_operator_user(user: Any) -> bool:
    """Staff users are operators; anyone else (anonymous, inactive, non-staff) is not."""
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


class OperatorConsumer(LoopConsumer):
    """`/ws/console/`: live events for the console. Login and staff status are checked before the
    socket joins any group; the origin is checked by the router in front of it."""

    groups: list[str] = []  # joined explicitly after the access check, never by default
    socket_kind = "console"

    async def connect(self) -> None:
        self.joined = False
        if not is_operator_user(self.scope.get("user")):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(OPERATORS_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self.send_json({"kind": "hello", "data": {"group": OPERATORS_GROUP}})

    async def disconnect(self, code: int) -> None:
        if getattr(self, "joined", False):
            await self.channel_layer.group_discard(OPERATORS_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The browser may ping to keep proxies from closing an idle socket; nothing else is accepted.
        if isinstance(content, dict) and content.get("kind") == "ping":
            await self.send_json({"kind": "pong", "data": {}})

    async def hub_event(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], "data": event["data"]})

    async def hub_events(self, message: dict[str, Any]) -> None:
        """Many events for this group at once (`announce_many`): each goes out as if alone."""
        for event in message["events"]:
            await self.hub_event(event)
