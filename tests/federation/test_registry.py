"""The machine-wide registry: private files, stale entries, one live hub per agent."""

from __future__ import annotations

import json
import stat
import time

import pytest

from federation.services.registry import (
    registry_agent_add,
    registry_entries,
    registry_remove_stale,
)


@pytest.fixture
def serving(settings):
    settings.SWITCHBOARD_PUBLIC_URL = "http://127.0.0.1:1"


def _foreign_entry(settings, name="bob", age=0.0, hub_key="k" * 44, url="http://127.0.0.1:9"):
    from federation.services.identity import key_fingerprint

    hub = key_fingerprint(hub_key)
    folder = settings.SWITCHBOARD_REGISTRY_DIR / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hub}--s1.json"
    path.write_text(
        json.dumps(
            {
                "hub": hub,
                "hub_key": hub_key,
                "hub_name": "other",
                "url": url,
                "id": "s1",
                "name": name,
                "name_key": name,
                "ref": "abc234",
                "cwd": "/w",
                "updated_at": time.time() - age,
            }
        )
    )
    return path


def test_entries_are_written_0600_and_hidden_from_their_own_hub(serving, settings):
    registry_agent_add(session_id="x", name="alice", name_key="alice", ref="r", cwd="")
    [path] = (settings.SWITCHBOARD_REGISTRY_DIR / "agents").glob("*.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert registry_entries() == []
    assert [e.name for e in registry_entries(include_own=True)] == ["alice"]


def test_stale_entries_are_ignored_and_removed(serving, settings):
    fresh = _foreign_entry(settings, name="bob")
    stale = _foreign_entry(
        settings, name="old", hub_key="e" * 44, age=settings.SWITCHBOARD_REGISTRY_STALE_SECONDS + 5
    )
    assert [e.name for e in registry_entries()] == ["bob"]
    assert registry_remove_stale() == 1
    assert fresh.exists() and not stale.exists()


def test_nothing_is_written_without_a_registry_folder(settings):
    settings.SWITCHBOARD_REGISTRY_DIR = None
    settings.SWITCHBOARD_PUBLIC_URL = "http://127.0.0.1:1"
    registry_agent_add(session_id="x", name="alice", name_key="alice", ref="r", cwd="")
    assert registry_entries() == []


def test_registering_an_agent_live_in_another_hub_is_refused_with_409(
    serving, settings, api, enroll_key, monkeypatch
):
    _foreign_entry(settings, name="bob")
    monkeypatch.setattr("federation.services.registry._hub_answers", lambda url: True)
    refused = api.post("sessions", enroll_key, {"name": "bob", "cwd": "/w"})
    assert refused.status_code == 409, refused.json_body
    elsewhere = api.post("sessions", enroll_key, {"name": "bob", "cwd": "/elsewhere"})
    assert elsewhere.status_code == 201


def test_an_entry_whose_hub_is_gone_does_not_block_registration(
    serving, settings, api, enroll_key, monkeypatch
):
    path = _foreign_entry(settings, name="bob")
    monkeypatch.setattr("federation.services.registry._hub_answers", lambda url: False)
    assert api.post("sessions", enroll_key, {"name": "bob", "cwd": "/w"}).status_code == 201
    assert not path.exists()
