"""Celery tasks for teams: tiny, idempotent wrappers that take ids and call a service."""

from __future__ import annotations

from celery import shared_task

from teams.services.gates import gate_check_attempt, gate_checks_run_due
from teams.services.invitations import invitations_expire_due, join_requests_purge
from teams.services.shutdown import shutdowns_expire_due
from teams.services.subscriptions import subscriptions_lapse_due
from teams.services.teams import teams_purge_ended


@shared_task(name="teams.tasks.run_gate_check")
def run_gate_check(check_id: int) -> str:
    """Make one attempt at a quality-gate check (retries are scheduled by the sweep)."""
    return gate_check_attempt(check_id=check_id)


@shared_task(name="teams.tasks.sweep_teams")
def sweep_teams() -> dict[str, int]:
    """Expire unanswered protocol requests and team invitations, lapse old idle subscriptions,
    retry due gate checks, delete requests to join long closed."""
    return {
        "requests_expired": shutdowns_expire_due(),
        "invitations_expired": invitations_expire_due(),
        "subscriptions_lapsed": subscriptions_lapse_due(),
        "gate_checks_run": gate_checks_run_due(),
        "join_requests_purged": join_requests_purge(),
    }


@shared_task(name="teams.tasks.purge_ended_teams")
def purge_ended_teams() -> int:
    return teams_purge_ended()
