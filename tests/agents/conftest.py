"""Fixtures for the agent side: every HubClient talks to this test's hub in-process (WSGI)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from console.agent.client import HubClient

HUB_URL = "http://127.0.0.1:8765"


@pytest.fixture
def inprocess_hub(db: None, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Route every HubClient to the Django app in this process (same database as the test).
    Yields the hub URL the agent side should use."""
    from django.core.wsgi import get_wsgi_application

    monkeypatch.setenv("SWITCHBOARD_URL", HUB_URL)
    monkeypatch.setenv("SWITCHBOARD_ENROLL_KEY", settings.SWITCHBOARD_ENROLL_KEY)
    monkeypatch.setattr(HubClient, "default_transport", httpx.WSGITransport(app=get_wsgi_application()))
    yield HUB_URL
