"""Liveness and readiness for orchestrators: `/healthz` (this process answers) and `/readyz` (it can
do its work: database reachable, migrations applied, channel layer reachable when one is configured).

Neither needs a credential, and neither says more than which check failed: a prober learns nothing
about messages or sessions."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS = 2.0
_migrations_applied = False  # once true for this process's code it stays true: migrations only add


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and answering; it touches nothing else."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when every check passes, else 503 naming the checks that failed."""
    checks = {name: _run(check) for name, check in readiness_checks().items()}
    ready = all(result == "ok" for result in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "unready", "checks": checks}, status=200 if ready else 503
    )


def readiness_checks() -> dict[str, Callable[[], None]]:
    """The checks that apply to this process's configuration, by name."""
    checks: dict[str, Callable[[], None]] = {"database": database_reachable, "migrations": migrations_applied}
    if settings.REDIS_URL:
        checks["channel_layer"] = redis_reachable
    return checks


def _run(check: Callable[[], None]) -> str:
    try:
        check()
    except Exception as exc:  # a failed check is an answer, not an error of this view
        log.warning("readiness check %s failed: %s", check.__name__, exc)
        return f"failed: {type(exc).__name__}"
    return "ok"


def database_reachable() -> None:
    """One round trip to the database (raises when it is down)."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")


def migrations_applied() -> None:
    """Raises while any migration of this code is not applied to the database."""
    global _migrations_applied
    if _migrations_applied:
        return
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if pending:
        raise RuntimeError(f"{len(pending)} migrations not applied")
    _migrations_applied = True


def redis_reachable() -> None:
    """PING the Redis behind the channel layer and the task broker, with a short timeout."""
    import redis

    started = time.monotonic()
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=CHECK_TIMEOUT_SECONDS, socket_connect_timeout=CHECK_TIMEOUT_SECONDS
    )
    try:
        client.ping()
    finally:
        client.close()
    log.debug("redis answered in %.1f ms", (time.monotonic() - started) * 1000)
