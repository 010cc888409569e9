"""How fast the task board hands out work: claims per second through the service layer.

Two figures on the embedded footprint (a SQLite file in a fresh SWITCHBOARD_HOME, WAL, IMMEDIATE)
or on PostgreSQL with --database-url:
  - one teammate calling claim-next until the board is empty (uncontended claims/s);
  - 8 threads racing for one task per round (rounds/s, and that each round had one winner).

    .venv/bin/python bench/teams_claim.py [--tasks 500] [--rounds 100] [--database-url postgres://...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    os.environ.setdefault("SWITCHBOARD_HOME", tempfile.mkdtemp(prefix="sb-bench-"))
    os.environ["SWITCHBOARD_JOBS"] = "inline"
    os.environ["SWITCHBOARD_LOG_LEVEL"] = "WARNING"
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from hub_fixtures.claim_race import prepare, race_threads
    from messaging.models import AgentSession
    from messaging.principals import session_principal
    from teams.services.tasks import task_claim_next
    from teams.services.teams import team_get

    call_command("migrate", verbosity=0)
    ids = prepare(workers=8, rounds=args.tasks)
    team = team_get(team_id=ids["team"])
    actor = session_principal(AgentSession.objects.get(pk=ids["sessions"][0]))
    started = time.perf_counter()
    claimed = 0
    while task_claim_next(team=team, actor=actor) is not None:
        claimed += 1
    solo = time.perf_counter() - started
    print(
        f"{connection.vendor}: claim-next, one teammate: {claimed} claims in {solo:.2f} s = {claimed / solo:.0f}/s"
    )

    race_ids = prepare(workers=8, rounds=args.rounds)
    connection.close()
    started = time.perf_counter()
    result = race_threads(sessions=race_ids["sessions"], tasks=race_ids["tasks"])
    raced = time.perf_counter() - started
    ok = result["winners"] == [1] * args.rounds and not result["errors"]
    print(
        f"{connection.vendor}: 8 threads racing, {args.rounds} rounds in {raced:.2f} s = "
        f"{args.rounds / raced:.0f} rounds/s ({raced / args.rounds * 1000:.1f} ms a round); "
        f"one winner every round: {ok}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
