"""Celery tasks for operator alerts: tiny wrappers that call a service."""

from __future__ import annotations

from celery import shared_task

from alerts.services import alerts_run as alerts_run_service


@shared_task(name="alerts.tasks.alerts_run")
def alerts_run() -> dict[str, int]:
    """Detect what needs an operator and post the due alerts (alerts.services)."""
    return alerts_run_service()
