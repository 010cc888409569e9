"""API fuzzing: schemathesis against the live OpenAPI schema of a web process, with valid tokens.

Two runs, each recording how many cases it ran (printed, and written next to the other results in
`bench/results/fuzz-*.json`):
- every operation with a session token, then every operation with an operator token: no answer is
  a 5xx (schemathesis' `not_a_server_error` check);
- the messaging core operations (messages, batch, inbox, ack, agents, ping, sessions/me) with a
  session token and every check: no 5xx, answers match their documented schemas, status codes
  and content types.
The session's own exit (`DELETE /sessions/me`, `PATCH /sessions/me`) is left out: it would revoke
the token the rest of the run uses. `positive_data_acceptance` is left out of the core run: the
schema cannot express every domain rule (a blank-looking message, a broadcast address), and those
are refused with a documented 400. The hub runs with long-polls capped at 1 s so fuzzed `wait`
values do not stall the run. SB_FUZZ_EXAMPLES sets the examples per operation (default 5; the figures in docs/performance.md used 10).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.integration.harness import REPO, VENV_BIN

pytestmark = pytest.mark.integration
EXAMPLES = os.environ.get("SB_FUZZ_EXAMPLES", "5")
KEEP_TOKEN = ["--exclude-path-regex", r"^/api/v1/sessions/me$"]
CORE = [
    "--include-path-regex",
    r"^/api/v1/(messages|messages/batch|messages/\{message_id\}|inbox|inbox/ack|agents|ping)$",
]


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory):
    """One web process (no worker or beat needed) with long-polls capped at 1 s."""
    from tests.integration.harness import RedisServer, database_drop, database_migrated, hub_start
    from tests.integration.ledger import LOAD_ENV

    workdir = tmp_path_factory.mktemp("fuzz")
    redis = RedisServer(workdir).start()
    url = database_migrated()
    hub = None
    try:
        hub = hub_start(
            database_url=url,
            redis_url=redis.url(),
            workdir=workdir,
            webs=1,
            worker=False,
            beat=False,
            migrate=False,
            extra_env={**LOAD_ENV, "SWITCHBOARD_INBOX_MAX_WAIT": "1"},
        )
        yield hub
    finally:
        if hub:
            hub.stop()
        redis.stop()
        database_drop(url)


def schemathesis(hub, token: str, *args: str) -> tuple[int, int, str]:
    out = subprocess.run(
        [
            str(VENV_BIN / "st"),
            "run",
            f"{hub.web_urls[0]}/api/openapi.json",
            "-H",
            f"Authorization: Bearer {token}",
            "-n",
            EXAMPLES,
            "--seed",
            "1",
            "--no-color",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    found = re.search(r"(\d+) generated", out.stdout)
    assert found, out.stdout[-3000:] + out.stderr[-2000:]
    return out.returncode, int(found.group(1)), out.stdout


def record(name: str, cases: int, code: int) -> None:
    folder = Path(REPO) / "bench" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (folder / f"fuzz-{name}-{stamp}.json").write_text(
        json.dumps({"run": name, "cases": cases, "exit": code}) + "\n"
    )
    print(f"\nschemathesis {name}: {cases} cases, exit {code}")


def test_no_operation_answers_a_5xx_to_a_session_or_an_operator(fuzz_hub):
    hub = fuzz_hub
    session = hub.register("fuzz-session", web=0)
    hub.register("fuzz-peer", web=0)
    code, cases, out = schemathesis(hub, session.token, "--checks", "not_a_server_error", *KEEP_TOKEN)
    record("all-session", cases, code)
    assert code == 0, out[-6000:]
    code, cases, out = schemathesis(hub, hub.operator_token(), "--checks", "not_a_server_error")
    record("all-operator", cases, code)
    assert code == 0, out[-6000:]


def test_the_messaging_core_answers_match_their_schemas(fuzz_hub):
    hub = fuzz_hub
    session = hub.register("fuzz-core", web=0)
    hub.register("fuzz-core-peer", web=0)
    code, cases, out = schemathesis(
        hub, session.token, "--checks", "all", "--exclude-checks", "positive_data_acceptance", *CORE
    )
    record("core-all-checks", cases, code)
    assert code == 0, out[-8000:]
