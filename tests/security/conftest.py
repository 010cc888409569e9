"""Fixtures the security tests share: this hub's API through the test client, and another hub
calling it."""

from __future__ import annotations

import pytest
from django.test import Client
from nacl.signing import SigningKey

from tests.federation.conftest import OtherHub


@pytest.fixture
def hub_client(db: None) -> Client:
    """This hub's API through Django's test client (database available)."""
    return Client()


@pytest.fixture
def sender_hub() -> OtherHub:
    """Another hub, with its own key."""
    return OtherHub(SigningKey.generate())
