from typing import Any

from django.apps import AppConfig
from django.urls import reverse


def message_page(message_id: Any) -> str:
    """The console's page for one message: where an operator reads it whole (an audited reveal)."""
    return reverse("console:message", args=[message_id])


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"

    def ready(self) -> None:
        from console import signals
        from messaging.plugins import PLUGINS

        signals.connect()
        PLUGINS.message_page = message_page  # the admin's link to reveal a sensitive message
