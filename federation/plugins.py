"""What `federation` plugs into `messaging` (see `messaging.plugins`), registered by
`FederationConfig.ready`: routes to agents other hubs host, the names and progress those hubs
report, files attached to messages, and this machine's registry of live agents."""

from __future__ import annotations

from typing import Any

from federation.models import MessageAttachment
from messaging.liveness import LIVE
from messaging.models import AgentSession, SessionStatus
from messaging.plugins import PLUGINS, RemoteSend, session_registered, session_status_changed


class OtherHubsFederated:
    """Other hubs on this machine (the registry), on the LAN, and behind the relay."""

    def route(self, *, sender: AgentSession, target: str) -> RemoteSend | None:
        from federation.services.forwarding import route_for_send

        return route_for_send(sender=sender, target=target)

    def hub_name(self, session_id: Any, *, vouched: bool) -> str:
        from federation.services.forwarding import remote_hub_name

        return remote_hub_name(session_id, vouched=vouched)

    def agents(self, *, name: str | None) -> list[dict[str, Any]]:
        from federation.services.discovery import remote_agents_list

        return remote_agents_list(name=name)

    def progress(self, *, delivery_ids: list[int]) -> dict[int, dict[str, Any]]:
        from federation.services.receipts import remote_progress

        return remote_progress(delivery_ids=delivery_ids)

    def live_elsewhere(self, *, name_key: str, cwd: str) -> str | None:
        from federation.services.registry import registry_conflict

        entry = registry_conflict(name_key=name_key, cwd=cwd)
        return entry.hub_name if entry is not None else None

    def forward(self, *, delivery_id: int) -> None:
        from federation.services.forwarding import forward_released

        forward_released(delivery_id=delivery_id)

    def hand_over(self, *, delivery_ids: list[int]) -> None:
        from federation.services.forwarding import forwards_hand_over

        forwards_hand_over(delivery_ids=delivery_ids)


class StoredFiles:
    """Files uploaded to this hub, attached to messages by SHA-256 (federation.services.files)."""

    table = MessageAttachment._meta.db_table

    def head(self, *, sha256: str, holder_id: Any) -> bytes:
        from federation.services.files import file_head_held

        return file_head_held(sha256=sha256, session_id=holder_id)

    def attach(self, *, message_id: Any, sender_id: Any, files: list[dict[str, str]], tier: str) -> None:
        from federation.services.files import files_attach

        files_attach(message_id=message_id, sender_id=sender_id, files=files, tier=tier)

    def deliver(self, *, message_id: Any, recipient_id: Any) -> list[dict[str, Any]]:
        from federation.services.files import files_deliver

        return files_deliver(message_id=message_id, recipient_id=recipient_id)

    def carrying(self, *, message_ids: list[Any]) -> set[Any]:
        return set(
            MessageAttachment.objects.filter(message_id__in=message_ids).values_list("message_id", flat=True)
        )


def _registry_keep(session: AgentSession, *, live: bool) -> None:
    from federation.services.registry import registry_session_changed

    registry_session_changed(
        session_id=str(session.id),
        name=session.name,
        name_key=session.name_key,
        ref=session.ref,
        cwd=session.cwd,
        live=live,
    )


def _registered(*, session: AgentSession, **_: object) -> None:
    _registry_keep(session, live=session.status != SessionStatus.STOPPED)


def _status_changed(*, session: AgentSession, previous: str, **_: object) -> None:
    if previous != session.status:
        _registry_keep(session, live=session.status in LIVE)


def federation_plug_in() -> None:
    """Register federation on messaging's plug-in points (once per process)."""
    PLUGINS.other_hubs = OtherHubsFederated()
    PLUGINS.attachments = StoredFiles()
    session_registered.connect(_registered, dispatch_uid="federation.registry")
    session_status_changed.connect(_status_changed, dispatch_uid="federation.registry")
