"""Which federation jobs beat (or `serve`'s scheduler) runs: only what the hub's settings call for."""

from __future__ import annotations

from django.test import override_settings

from federation.apps import federation_jobs


def _names(**settings: str) -> set[str]:
    with override_settings(**settings):
        return {job.task_name for job in federation_jobs()}


ALWAYS = {
    "federation.tasks.retry_forwards",
    "federation.tasks.send_receipts",
    "federation.tasks.registry_refresh",
    "federation.tasks.nonces_prune",
    "federation.tasks.remote_sessions_prune",
    "federation.tasks.files_cleanup",
}


def test_a_hub_without_a_relay_does_not_poll_one() -> None:
    assert _names(SWITCHBOARD_RELAY_URL="", SWITCHBOARD_ROLE="hub") == ALWAYS


def test_a_hub_with_a_relay_pulls_from_it_every_poll() -> None:
    with override_settings(SWITCHBOARD_RELAY_URL="http://relay.example:9000", SWITCHBOARD_ROLE="hub"):
        jobs = {job.task_name: job.every_seconds for job in federation_jobs()}
        from django.conf import settings

        assert jobs.keys() == ALWAYS | {"federation.tasks.relay_pull"}
        assert jobs["federation.tasks.relay_pull"] == settings.SWITCHBOARD_FEDERATION_POLL_SECONDS


def test_a_relay_cleans_up_and_pulls_from_no_relay() -> None:
    names = _names(SWITCHBOARD_RELAY_URL="http://relay.example:9000", SWITCHBOARD_ROLE="relay")

    assert names == ALWAYS | {"federation.tasks.relay_cleanup"}


def test_the_schedule_holds_each_job_once() -> None:
    from messaging.jobs import PERIODIC_JOBS

    names = [job.task_name for job in PERIODIC_JOBS]
    assert len(names) == len(set(names))
    assert set(names) >= ALWAYS
