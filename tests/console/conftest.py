"""Fixtures for the console: an operator's logged-in browser client and a non-operator's."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client


@pytest.fixture
def operator_client(db: None) -> Client:
    """A browser logged in as the staff user `op` (an operator). CSRF is enforced, as in a browser."""
    user = get_user_model().objects.create_user("op", password="op-password-123", is_staff=True)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.fixture
def visitor_client(db: None) -> Client:
    """A browser logged in as a user who is not staff: not an operator."""
    user = get_user_model().objects.create_user("visitor", password="visitor-pw-123", is_staff=False)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_post(client: Client, url: str, data: dict[str, Any], **headers: Any) -> Any:
    """POST a form the way the page does: with the CSRF token the page rendered."""
    page = client.get("/login/")  # public, and renders a token like every console form
    token = page.context["csrf_token"]
    return client.post(url, {**data, "csrfmiddlewaretoken": str(token)}, **headers)
