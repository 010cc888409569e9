"""The machine registry vouches for a hub (the channel tier) only when nobody but this user can
have written its entry: folders owned by this user and not writable by group or others, entries
that are this user's own regular files (never symbolic links) that nobody else can write.

Each attack is a hub entry another local user could have planted, sent a forward through the HTTP
API by the hub whose key it lists. "Another user" is simulated with os.chown to uid 65534 (nobody),
so those cases run only as root; the mode and symlink cases run as any user.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from federation.services import registry
from federation.services.identity import key_fingerprint
from tests.federation.conftest import OtherHub, federation_isolated

URL = "/api/v1/federation/messages"
NOBODY = 65534

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user"
)


@pytest.fixture(autouse=True)
def _federation_dirs(settings: Any, tmp_path: Path) -> None:
    """Registry and files in the test's own folders (so registry warnings, once per path, are per test)."""
    federation_isolated(settings, tmp_path)
    settings.SWITCHBOARD_PEER_TOFU = True


@pytest.fixture
def neighbour() -> OtherHub:
    """Another hub on this machine, whose key a registry entry may list."""
    return OtherHub(SigningKey.generate(), name="neighbour-hub")


@pytest.fixture
def root(settings: Any) -> Path:
    """The registry folder with its `hubs` folder, both this user's own and 0700."""
    path = Path(settings.SWITCHBOARD_REGISTRY_DIR)
    (path / "hubs").mkdir(parents=True)
    for folder in (path, path / "hubs"):
        os.chmod(folder, 0o700)
    return path


def _hub_entry(root: Path, hub: OtherHub, *, mode: int = 0o600) -> Path:
    """`hub`'s entry in the registry's `hubs` folder, as a hub writes it, then given `mode`."""
    entry = root / "hubs" / f"{key_fingerprint(hub.public_key)}.json"
    entry.write_text(
        json.dumps(
            {
                "name": hub.name,
                "url": "http://127.0.0.1:9",
                "public_key": hub.public_key,
                "updated_at": time.time(),
            }
        )
    )
    os.chmod(entry, mode)
    return entry


def _trust_of_forward(client: Any, hub: OtherHub) -> dict[str, Any]:
    """What this hub answers to a message `hub` forwards to the local agent bob."""
    sent = hub.call(client, "POST", URL, {"envelope": hub.envelope(to="bob", text="from a neighbour")})
    assert sent.status_code == 201, sent.json_body
    return sent.json_body


def _is_unvouched(body: dict[str, Any]) -> bool:
    return body["trust"] == "unverified" and body["status"] == "held"


# --- the control: an entry this user wrote privately vouches -------------------------------------


def test_a_private_entry_of_this_user_vouches_for_the_channel_tier(client, register, neighbour, root):
    register("bob")
    _hub_entry(root, neighbour)

    assert _trust_of_forward(client, neighbour)["trust"] == "channel-verified"


# --- entries another local user could have written ------------------------------------------------


@needs_root
def test_a_registry_entry_written_by_another_local_user_does_not_vouch_for_the_channel_tier(
    client, register, neighbour, settings
):
    """The audit's proof of concept: a registry folder another local user made (world-writable)
    and a hub entry that user owns (0666) must not vouch for the key as `channel`."""
    register("bob")
    root = Path(settings.SWITCHBOARD_REGISTRY_DIR)
    (root / "hubs").mkdir(parents=True)
    for folder in (root, root / "hubs"):
        os.chmod(folder, 0o777)  # made by someone else, open to every local user
    entry = _hub_entry(root, neighbour, mode=0o666)
    os.chown(entry, NOBODY, NOBODY)  # owned by another local user (nobody)

    assert _is_unvouched(_trust_of_forward(client, neighbour))


@pytest.mark.parametrize("open_folder", ["registry", "hubs"])
def test_an_entry_in_a_folder_others_can_write_does_not_vouch(client, register, neighbour, root, open_folder):
    """Even this user's own 0600 entry: anyone who can write the folder can swap it."""
    register("bob")
    _hub_entry(root, neighbour)
    os.chmod(root if open_folder == "registry" else root / "hubs", 0o777)

    assert _is_unvouched(_trust_of_forward(client, neighbour))


@needs_root
def test_an_entry_in_a_folder_another_user_owns_does_not_vouch(client, register, neighbour, root):
    register("bob")
    _hub_entry(root, neighbour)
    os.chown(root / "hubs", NOBODY, NOBODY)  # 0700, but another user's

    assert _is_unvouched(_trust_of_forward(client, neighbour))


@needs_root
def test_an_entry_another_user_owns_does_not_vouch_even_when_private(client, register, neighbour, root):
    register("bob")
    os.chown(_hub_entry(root, neighbour), NOBODY, NOBODY)

    assert _is_unvouched(_trust_of_forward(client, neighbour))


@pytest.mark.parametrize(("mode", "vouched"), [(0o600, True), (0o644, True), (0o660, False), (0o666, False)])
def test_an_entry_others_can_write_does_not_vouch(client, register, neighbour, root, mode, vouched):
    """Read bits for others reveal only a public key; write bits let them change it."""
    register("bob")
    _hub_entry(root, neighbour, mode=mode)

    trust = _trust_of_forward(client, neighbour)["trust"]

    assert (trust == "channel-verified") is vouched, (oct(mode), trust)


def test_a_symlinked_entry_is_neither_followed_nor_trusted(client, register, neighbour, root, tmp_path):
    """A link to a private file elsewhere (whoever made the link chose what it says) is ignored."""
    register("bob")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    target = _hub_entry(root, neighbour).rename(elsewhere / "entry.json")
    (root / "hubs" / target.name.replace("entry", key_fingerprint(neighbour.public_key))).symlink_to(target)

    assert _is_unvouched(_trust_of_forward(client, neighbour))


def test_an_agent_entry_others_can_write_is_not_a_route(settings, root):
    """The same rule for `agents`: an entry others can write names no live agent of another hub."""
    agents = root / "agents"
    agents.mkdir(mode=0o700)
    hub_key = "k" * 44
    fp = key_fingerprint(hub_key)
    entry = agents / f"{fp}--s1.json"
    entry.write_text(
        json.dumps(
            {
                "hub": fp,
                "hub_key": hub_key,
                "hub_name": "other",
                "url": "http://127.0.0.1:9",
                "id": "s1",
                "name": "bob",
                "name_key": "bob",
                "ref": "abc234",
                "cwd": "/w",
                "updated_at": time.time(),
            }
        )
    )
    os.chmod(entry, 0o600)
    assert [e.name for e in registry.registry_entries()] == ["bob"]

    os.chmod(entry, 0o666)

    assert registry.registry_entries() == []


# --- what the operator sees ------------------------------------------------------------------------


def test_an_ignored_entry_is_warned_about_once_without_its_contents(
    client, register, neighbour, root, caplog
):
    register("bob")
    entry = _hub_entry(root, neighbour, mode=0o666)

    with caplog.at_level(logging.WARNING, logger="federation.services.registry"):
        for _ in range(3):
            registry.registry_hub_keys()

    warnings = [r.getMessage() for r in caplog.records if r.name == "federation.services.registry"]
    assert len(warnings) == 1, warnings
    assert str(entry) in warnings[0] and "writable by group or others (mode 0666)" in warnings[0]
    assert neighbour.public_key not in warnings[0]


def test_the_status_line_says_why_the_registry_is_ignored(root):
    assert registry.registry_status() == str(root)

    os.chmod(root, 0o777)

    status = registry.registry_status()
    assert status.startswith(f"{root} IGNORED") and "writable by group or others (mode 0777)" in status


def test_the_status_line_counts_ignored_entries(root, neighbour):
    _hub_entry(root, neighbour, mode=0o666)

    assert (
        registry.registry_status()
        == f"{root} (1 entries ignored: not this user's own files, or writable by others)"
    )


# --- this hub's own writes ---------------------------------------------------------------------------


@pytest.fixture
def serving(settings: Any) -> None:
    """This hub serves, so it writes to the registry."""
    settings.SWITCHBOARD_PUBLIC_URL = "http://127.0.0.1:1"


def test_a_new_registry_is_made_private(serving, settings):
    registry.registry_hub_announce()

    root = Path(settings.SWITCHBOARD_REGISTRY_DIR)
    [entry] = (root / "hubs").glob("*.json")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (root, root / "hubs", entry)] == [0o700, 0o700, 0o600]


def test_a_registry_folder_of_this_user_holding_only_the_registry_is_tightened(serving, root):
    """Earlier versions made the registry folder with the umask's mode (0775 under umask 002)."""
    os.chmod(root, 0o775)

    registry.registry_hub_announce()

    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert len(list((root / "hubs").glob("*.json"))) == 1


def test_a_too_open_folder_holding_other_things_is_left_alone_and_not_written(serving, root):
    (root / "notes.txt").write_text("the operator's")
    os.chmod(root, 0o777)

    registry.registry_hub_announce()

    assert stat.S_IMODE(root.stat().st_mode) == 0o777
    assert list((root / "hubs").glob("*.json")) == []
    assert registry.registry_status().startswith(f"{root} IGNORED")


@needs_root
def test_this_hub_writes_nothing_into_a_registry_folder_another_user_owns(serving, root):
    os.chown(root, NOBODY, NOBODY)

    registry.registry_hub_announce()

    assert list((root / "hubs").glob("*.json")) == []


def test_stale_cleanup_leaves_entries_it_does_not_trust(root, neighbour, settings):
    """Cleaning up is a write too: never in a folder others can write, never another user's file."""
    stale = _hub_entry(root, neighbour, mode=0o666)
    old = time.time() - settings.SWITCHBOARD_REGISTRY_STALE_SECONDS - 5
    stale.write_text(json.dumps({"public_key": neighbour.public_key, "updated_at": old}))

    assert registry.registry_remove_stale() == 0
    assert stale.exists()

    os.chmod(stale, 0o600)

    assert registry.registry_remove_stale() == 1
    assert not stale.exists()


def test_a_dangling_link_in_place_of_the_registry_stops_nothing_but_the_registry(serving, settings, tmp_path):
    """Whoever can write the registry's parent folder may leave a broken link there: the hub still
    starts and answers, without the registry."""
    root = Path(settings.SWITCHBOARD_REGISTRY_DIR)
    root.symlink_to(tmp_path / "nowhere")

    registry.registry_hub_announce()

    assert registry.registry_hub_keys() == {}
    assert not (tmp_path / "nowhere").exists()
