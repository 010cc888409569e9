"""messaging's plug-in points: teams and federation register on them when Django starts, and each
point's default holds on a hub where nothing registered."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from messaging import jobs
from messaging.plugins import PLUGINS, NoAttachments, NoGuard, PlugIns, ThisHubOnly, session_status_changed
from tests.messaging.conftest import Pair


def test_teams_federation_and_the_console_plug_in_when_django_starts() -> None:
    from console.apps import message_page
    from federation.plugins import OtherHubsFederated, StoredFiles
    from teams.plugins import ObserverGuard
    from teams.selectors import lead_session_of

    assert isinstance(PLUGINS.send_guard, ObserverGuard)
    assert PLUGINS.lead_of is lead_session_of
    assert isinstance(PLUGINS.other_hubs, OtherHubsFederated)
    assert isinstance(PLUGINS.attachments, StoredFiles)
    assert PLUGINS.message_page is message_page
    listeners = {receiver[0][0] for receiver in session_status_changed.receivers}
    assert {"teams.status", "federation.registry"} <= listeners


@pytest.mark.django_db
def test_the_default_guard_restricts_nobody(pair: Pair) -> None:
    """The default guard's condition reads as false in the database the hub runs on."""
    session = pair[0]
    ident = session._meta.pk.get_db_prep_value(session.id, connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {NoGuard.restricted_sql}", [ident])
        (restricted,) = cursor.fetchone()
    assert not restricted
    assert NoGuard().check(sender=session, recipient=session, kind="text") is None


def test_the_defaults_keep_everything_on_this_hub() -> None:
    hubs = ThisHubOnly()
    assert hubs.route(sender=None, target="bob@elsewhere") is None  # type: ignore[arg-type]
    assert hubs.agents(name=None) == [] and hubs.progress(delivery_ids=[1]) == {}
    assert hubs.live_elsewhere(name_key="bob", cwd="/") is None
    assert NoAttachments().carrying(message_ids=["x"]) == set()
    assert PlugIns().message_page("m1") is None  # no console: the admin links to no page


def test_a_job_started_from_any_thread_runs_on_the_projects_celery_app() -> None:
    """`messaging.jobs` finds tasks through `celery.current_app`: the project's app in every thread
    (request threads, the embedded pool), never Celery's unconfigured fallback."""
    from hub.celery import app

    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(jobs._task("messaging.tasks.purge_audit").app))
    thread.start()
    thread.join(timeout=10)
    assert found == [app]
