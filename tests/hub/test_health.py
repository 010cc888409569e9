"""`/healthz` and `/readyz`: what an orchestrator asks a web process."""

from __future__ import annotations

import pytest
from django.test import Client

import hub.health as health


def test_healthz_answers_without_a_credential(client: Client) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ready_when_the_database_answers_and_is_migrated(client: Client) -> None:
    r = client.get("/readyz")
    assert r.status_code == 200, r.content
    assert r.json()["status"] == "ready"
    assert r.json()["checks"]["database"] == "ok"
    assert r.json()["checks"]["migrations"] == "ok"


@pytest.mark.django_db
def test_readyz_is_unready_while_a_migration_is_not_applied(client: Client, monkeypatch) -> None:
    # Given a database that lacks the latest migration of one app
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    monkeypatch.setattr(health, "_migrations_applied", False)
    recorder = MigrationRecorder(connection)
    latest = recorder.migration_qs.filter(app="messaging").order_by("-id").first()
    recorder.migration_qs.filter(pk=latest.pk).delete()

    # When an orchestrator asks whether the process is ready
    r = client.get("/readyz")

    # Then it is not, and the answer names the check that failed
    assert r.status_code == 503
    assert r.json()["status"] == "unready"
    assert r.json()["checks"]["migrations"].startswith("failed")
    assert r.json()["checks"]["database"] == "ok"


def test_readyz_checks_the_channel_layer_only_when_redis_is_configured(settings) -> None:
    settings.REDIS_URL = None
    assert "channel_layer" not in health.readiness_checks()
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert "channel_layer" in health.readiness_checks()
