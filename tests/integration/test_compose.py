"""compose.yaml, checked structurally (no container engine runs here, so it is parsed, not started).

These run in the fast suite: they need no services. What they cannot prove is that the images
pull and the containers start; the processes compose runs are the ones the real-services suite
starts directly (same commands, same environment variables).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LONG_RUNNING = ("postgres", "redis", "web", "worker", "beat", "proxy")
HOME_MODULES = ("messaging/home.py", "switchboard_agent/home.py")  # where SWITCHBOARD_HOME is read
APP_SERVICES = ("migrate", "web", "worker", "beat")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def settings_env_names() -> set[str]:
    """Every environment variable hub/settings.py (and the home module) reads."""
    source = "".join((REPO / path).read_text() for path in ("hub/settings.py", *HOME_MODULES))
    return set(re.findall(r"""(?:environ\.get|_env_int|_env_bool)\(\s*["']([A-Z_]+)["']""", source))


def test_every_part_of_the_topology_is_a_service(compose):
    assert set(LONG_RUNNING) | {"migrate"} <= set(compose["services"])


def test_every_long_running_service_has_a_health_check(compose):
    for name in LONG_RUNNING:
        check = compose["services"][name].get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert check["test"] and check["interval"] and check["retries"] >= 1, name


def test_web_processes_are_checked_by_their_readiness_and_the_proxy_by_its_liveness(compose):
    # /readyz fails while the web process cannot reach PostgreSQL or Redis, so compose holds the
    # proxy back until the hub can work, not merely until daphne listens.
    assert "/readyz" in " ".join(compose["services"]["web"]["healthcheck"]["test"])
    assert "/healthz" in " ".join(compose["services"]["proxy"]["healthcheck"]["test"])


def test_app_services_run_the_same_commands_the_suite_runs(compose):
    services = compose["services"]
    assert services["web"]["command"][:2] == ["switchboard", "web"]
    assert services["web"]["command"][-1] == "hub.asgi:application"
    assert services["worker"]["command"][:4] == ["celery", "-A", "hub", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "hub", "beat"]
    assert services["migrate"]["command"][-2:] == ["migrate", "--noinput"]


def test_web_and_workers_scale_and_beat_stays_single(compose):
    services = compose["services"]
    assert services["beat"]["deploy"]["replicas"] == 1
    assert services["web"]["deploy"]["replicas"] >= 2
    assert "ports" not in services["web"], (
        "scaled web replicas cannot share a host port; the proxy publishes it"
    )
    assert services["proxy"]["ports"]


def test_app_services_get_the_environment_the_settings_read(compose):
    read = settings_env_names()
    assert {"DATABASE_URL", "REDIS_URL", "SWITCHBOARD_SECRET_KEY", "SWITCHBOARD_ENROLL_KEY"} <= read
    for name in APP_SERVICES:
        env = compose["services"][name]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "SWITCHBOARD_SECRET_KEY", "SWITCHBOARD_ENROLL_KEY"} <= set(
            env
        ), name
        unknown = {k for k in env if k.startswith("SWITCHBOARD_") or k.endswith("_URL")} - read
        assert not unknown, f"{name} sets variables the settings never read: {unknown}"
        assert "@postgres:5432/" in env["DATABASE_URL"] and env["REDIS_URL"].startswith("redis://redis:")


def test_app_services_wait_for_healthy_dependencies_and_migrations(compose):
    services = compose["services"]
    for name in ("web", "worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name
    assert services["web"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_named_volumes_are_declared_and_the_image_is_buildable(compose):
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
    assert {"pgdata", "redisdata"} <= declared
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install" in dockerfile and "hub.asgi:application" in dockerfile
    for name in APP_SERVICES:
        assert compose["services"][name]["build"] == "."


def test_secrets_are_required_not_defaulted():
    # `${VAR:?...}` makes compose refuse to start without the secret instead of running with a blank one.
    text = (REPO / "compose.yaml").read_text()
    for var in ("SWITCHBOARD_SECRET_KEY", "SWITCHBOARD_ENROLL_KEY", "POSTGRES_PASSWORD"):
        assert re.search(r"\$\{" + var + r":\?", text), var


def test_every_process_of_the_hub_shares_one_home(compose):
    # hub.key is the hub's identity and SWITCHBOARD_FILES_DIR (under the home) its stored files:
    # a web replica or worker with a home of its own signs with another key and misses uploads.
    homes = set()
    for name in APP_SERVICES:
        service = compose["services"][name]
        home = service["environment"]["SWITCHBOARD_HOME"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}
        assert home in mounts, f"{name} keeps {home} in its own container"
        homes.add(mounts[home])
    assert len(homes) == 1 and homes <= set(compose["volumes"])


def test_the_proxy_passes_the_largest_body_the_hub_takes(compose):
    # Hub-to-hub calls carry files as base64 up to 280 MiB; the hub refuses each route's excess itself.
    size = re.search(r"client_max_body_size (\d+)m;", compose["configs"]["nginx"]["content"])
    assert size and int(size.group(1)) >= 280
