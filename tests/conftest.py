"""Fixtures shared by every test: an isolated hub home, an API client, registered sessions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from hypothesis import settings as hypothesis_settings

# Property tests judge correctness, not speed: on a loaded 2-core machine an example can take
# longer than hypothesis' default 200 ms deadline, which would fail a correct test.
hypothesis_settings.register_profile("switchboard", deadline=None, print_blob=True)
hypothesis_settings.load_profile("switchboard")


_TRIGGERED_TABLES = {
    "postgresql": "SELECT DISTINCT tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal",
    "sqlite": "SELECT DISTINCT tbl_name FROM sqlite_master WHERE type = 'trigger'",
}
_DJANGO_FLUSH: dict[str, Callable[..., list[str]]] = {}  # by vendor, while the test database is up


def _flush_sql(
    ops: Any, style: Any, tables: list[str], *, reset_sequences: bool = False, allow_cascade: bool = False
) -> list[str]:
    """The flush between transactional tests: every table emptied, tables with triggers first, so
    the rows their triggers write on a delete (the unread counts) go too. On PostgreSQL as DELETE
    statements in one transaction with the foreign keys deferred (Django declares them DEFERRABLE),
    not one TRUNCATE, which replaces each table's files and costs about 0.3 s however few rows the
    test wrote; DELETE costs what the rows cost."""
    vendor = ops.connection.vendor
    with ops.connection.cursor() as cursor:
        cursor.execute(_TRIGGERED_TABLES[vendor])
        triggered = {name for (name,) in cursor.fetchall()}
    tables = sorted(tables, key=lambda table: table not in triggered)
    if vendor == "postgresql" and tables and not reset_sequences:
        return ["SET CONSTRAINTS ALL DEFERRED"] + [f"DELETE FROM {ops.quote_name(table)}" for table in tables]
    flush = _DJANGO_FLUSH[vendor]
    return flush(ops, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, flushed between transactional tests by `_flush_sql`, with the
    connections other threads left open ended before it is dropped. Async tests and the API's
    request threads each open a connection of their own on PostgreSQL, which outlive the test; the
    drop then failed with "database is being accessed by other users" and left the database
    behind."""
    from django.db.backends.postgresql import base as postgresql
    from django.db.backends.sqlite3 import base as sqlite

    operations = {"postgresql": postgresql.DatabaseOperations, "sqlite": sqlite.DatabaseOperations}
    for vendor, ops in operations.items():
        _DJANGO_FLUSH[vendor], ops.sql_flush = ops.sql_flush, _flush_sql
    try:
        yield
    finally:
        for vendor, ops in operations.items():
            ops.sql_flush = _DJANGO_FLUSH.pop(vendor)
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            connection.close()


@pytest.fixture(autouse=True)
def _isolated_hub(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test gets its own SWITCHBOARD_HOME and machine-wide registry (so hubs started by other
    tests, or the user's own, are never discovered), and runs background jobs inline after commit.
    Child processes inherit both through the environment."""
    home = tmp_path / "hub-home"
    home.mkdir(mode=0o700)
    registry = tmp_path / "hub-registry"
    monkeypatch.setenv("SWITCHBOARD_HOME", str(home))
    monkeypatch.setenv("SWITCHBOARD_REGISTRY_DIR", str(registry))
    settings.SWITCHBOARD_HOME = home
    settings.SWITCHBOARD_REGISTRY_DIR = registry
    settings.SWITCHBOARD_ENROLL_KEY = "test-enroll-key-" + "x" * 24
    settings.SWITCHBOARD_JOBS = "inline"
    yield


@dataclass
class Api:
    """A JSON client for /api/v1 that remembers nothing between calls but what you pass it."""

    client: Client

    def call(self, method: str, path: str, token: str | None = None, body: Any = None, **params: Any) -> Any:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
        url = path if path.startswith("/") else f"/api/v1/{path}"
        fn = getattr(self.client, method.lower())
        if method.upper() == "GET":
            response = fn(url, params, **headers)
        else:
            response = fn(
                url,
                data=json.dumps(body) if body is not None else "",
                content_type="application/json",
                **headers,
            )
        response.json_body = response.json() if response.content else None  # type: ignore[attr-defined]
        return response

    def get(self, path: str, token: str | None = None, **params: Any) -> Any:
        return self.call("GET", path, token, **params)

    def post(self, path: str, token: str | None = None, body: Any = None) -> Any:
        return self.call("POST", path, token, body)

    def patch(self, path: str, token: str | None = None, body: Any = None) -> Any:
        return self.call("PATCH", path, token, body)

    def delete(self, path: str, token: str | None = None) -> Any:
        return self.call("DELETE", path, token)


@pytest.fixture
def api(db: None) -> Api:
    """The REST API through Django's test client (database available)."""
    return Api(Client())


@dataclass
class Agent:
    """A registered session as a script sees it: its public fields and its token."""

    id: str
    name: str
    ref: str
    token: str
    data: dict[str, Any]


@pytest.fixture
def enroll_key(settings: Any) -> str:
    return settings.SWITCHBOARD_ENROLL_KEY


@pytest.fixture
def register(api: Api, enroll_key: str) -> Callable[..., Agent]:
    """Register a session through the API: `register("alice", cwd="/x", permission_mode="bypass")`."""

    def _register(name: str, **fields: Any) -> Agent:
        response = api.post("sessions", enroll_key, {"name": name, **fields})
        assert response.status_code == 201, response.json_body
        body = response.json_body
        return Agent(id=body["id"], name=body["name"], ref=body["ref"], token=body["token"], data=body)

    return _register


@pytest.fixture
def operator_token(db: None) -> str:
    """A fresh operator token (acts as a human at the switchboard)."""
    from messaging.principals import HUB
    from messaging.services.operator_tokens import operator_token_create

    return operator_token_create(name="test-operator", actor=HUB)


@pytest.fixture
def send(api: Api) -> Callable[..., Any]:
    """Send through the API: `send(alice, "bob", "hello", summary="hi")` → the response."""

    def _send(sender: Agent, to: str, text: str, **fields: Any) -> Any:
        return api.post("messages", sender.token, {"to": to, "message": text, **fields})

    return _send
