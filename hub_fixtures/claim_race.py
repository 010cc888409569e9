"""A harness that races N workers to claim the same task, round after round.

Used by tests/teams/test_claim_race.py (threads on a file-backed SQLite database, in a child
process so the hub gets a real database file rather than pytest's shared in-memory one), by
tests/integration/test_teams_claim_race.py (processes on PostgreSQL) and by bench/teams_claim.py.
`naive=True` swaps in a read-then-write claim with no compare-and-set, to show the harness really
does race: it must produce double winners, or the real test proves nothing.

Run directly: `python -m hub_fixtures.claim_race --workers 8 --rounds 50` (needs SWITCHBOARD_HOME).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

BARRIER_TIMEOUT = 60.0


def prepare(*, workers: int, rounds: int) -> dict[str, Any]:
    """Create a lead, `workers` teammates and `rounds` tasks. Returns their ids (Django must be set up)."""
    from messaging.principals import operator_principal, session_principal
    from messaging.services.sessions import session_register
    from teams.services.tasks import task_create
    from teams.services.teams import team_add_member, team_create

    lead = session_register(name="race-lead").session
    lead_actor = session_principal(lead)
    team = team_create(lead=lead, name="race", actor=lead_actor)
    sessions = []
    for i in range(workers):
        mate = session_register(name=f"racer-{i}").session
        team_add_member(team=team, session=mate, actor=operator_principal("race"))
        sessions.append(str(mate.id))
    tasks = [task_create(team=team, actor=lead_actor, title=f"prize {r}").pk for r in range(rounds)]
    return {"team": str(team.id), "sessions": sessions, "tasks": tasks}


def claim_rounds(*, session_id: str, task_ids: list[int], barrier: Any, naive: bool = False) -> list[str]:
    """Claim task_ids[r] in round r, all workers released together by `barrier`. One outcome a round:
    `won`, `lost`, or `error:<type>`."""
    from django.db import close_old_connections, connection

    from messaging.errors import Conflict
    from messaging.models import AgentSession
    from messaging.principals import session_principal
    from teams.services.tasks import task_claim, task_get

    outcomes = []
    try:
        actor = session_principal(AgentSession.objects.get(pk=session_id))
        for task_id in task_ids:
            task = task_get(task_id=task_id)
            barrier.wait(timeout=BARRIER_TIMEOUT)
            try:
                if naive:
                    outcomes.append("won" if _naive_claim(task_id, actor) else "lost")
                else:
                    task_claim(task=task, actor=actor)
                    outcomes.append("won")
            except Conflict:
                outcomes.append("lost")
            except Exception as exc:  # counted, never hidden: the test fails on any error
                outcomes.append(f"error:{type(exc).__name__}:{exc}"[:200])
    finally:
        close_old_connections()
        connection.close()
    return outcomes


def claim_until_empty(*, session_id: str, team_id: str, barrier: Any) -> list[str]:
    """Call claim-next until the board is empty; return the ids won (or `error:...`)."""
    from django.db import close_old_connections, connection

    from messaging.models import AgentSession
    from messaging.principals import session_principal
    from teams.services.tasks import task_claim_next
    from teams.services.teams import team_get

    won: list[str] = []
    try:
        actor = session_principal(AgentSession.objects.get(pk=session_id))
        team = team_get(team_id=team_id)
        barrier.wait(timeout=BARRIER_TIMEOUT)
        for _ in range(10_000):
            try:
                task = task_claim_next(team=team, actor=actor)
            except Exception as exc:
                won.append(f"error:{type(exc).__name__}:{exc}"[:200])
                break
            if task is None:
                break
            won.append(str(task.pk))
    finally:
        close_old_connections()
        connection.close()
    return won


def race_claim_next(*, team_id: str, sessions: list[str]) -> dict[str, Any]:
    """Every worker drains the board with claim-next at once. Returns the ids each one won."""
    barrier = threading.Barrier(len(sessions))
    results: list[list[str]] = [[] for _ in sessions]

    def run(i: int) -> None:
        results[i] = claim_until_empty(session_id=sessions[i], team_id=team_id, barrier=barrier)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    won = [x for r in results for x in r if not x.startswith("error")]
    return {
        "claimed": len(won),
        "distinct": len(set(won)),
        "per_worker": [len(r) for r in results],
        "errors": [x for r in results for x in r if x.startswith("error")][:20],
    }


def _naive_claim(task_id: int, actor: Any) -> bool:
    """The race the real claim prevents: read, think, write, with no condition on the write."""
    from teams.models import Membership, Task, TaskStatus

    member = Membership.objects.get(session=actor.session, left_at__isnull=True)
    if Task.objects.get(pk=task_id).status != TaskStatus.PENDING:
        return False
    time.sleep(0.005)
    Task.objects.filter(pk=task_id).update(status=TaskStatus.IN_PROGRESS, owner=member)
    return True


def tally(results: list[list[str]]) -> dict[str, Any]:
    """Per round: how many won. Plus every error seen."""
    rounds = len(results[0]) if results else 0
    winners = [sum(1 for r in results if r[i] == "won") for i in range(rounds)]
    errors = [o for r in results for o in r if o.startswith("error")]
    return {"winners": winners, "errors": errors[:20]}


def race_threads(*, sessions: list[str], tasks: list[int], naive: bool = False) -> dict[str, Any]:
    barrier = threading.Barrier(len(sessions))
    results: list[list[str]] = [[] for _ in sessions]

    def run(i: int) -> None:
        results[i] = claim_rounds(session_id=sessions[i], task_ids=tasks, barrier=barrier, naive=naive)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return tally(results)


def process_worker(
    env: dict[str, str], session_id: str, tasks: list[int], barrier: Any, queue: Any, naive: bool
) -> None:
    """Entry point of one racing process: set up Django on the given database, then race."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    import django

    django.setup()
    queue.put((session_id, claim_rounds(session_id=session_id, task_ids=tasks, barrier=barrier, naive=naive)))


def race_processes(
    *, env: dict[str, str], sessions: list[str], tasks: list[int], naive: bool = False
) -> dict[str, Any]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(sessions))
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=process_worker, args=(env, s, tasks, barrier, queue, naive)) for s in sessions
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600)[1] for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return tally(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--processes", action="store_true", help="race processes instead of threads")
    parser.add_argument("--database-url", default="", help="default: SQLite in SWITCHBOARD_HOME")
    parser.add_argument("--next", action="store_true", help="drain the board with claim-next instead")
    args = parser.parse_args(argv)
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    else:
        os.environ.pop("DATABASE_URL", None)  # the embedded footprint: SQLite in SWITCHBOARD_HOME
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    ids = prepare(workers=args.workers, rounds=args.rounds)
    connection.close()
    started = time.monotonic()
    if args.next:
        result = race_claim_next(team_id=ids["team"], sessions=ids["sessions"])
    elif args.processes:
        env = {k: os.environ[k] for k in ("SWITCHBOARD_HOME", "DATABASE_URL") if k in os.environ}
        env["SWITCHBOARD_JOBS"] = "inline"
        result = race_processes(env=env, sessions=ids["sessions"], tasks=ids["tasks"], naive=args.naive)
    else:
        result = race_threads(sessions=ids["sessions"], tasks=ids["tasks"], naive=args.naive)
    result["vendor"] = connection.vendor
    result["database"] = str(connection.settings_dict["NAME"])
    result["seconds"] = round(time.monotonic() - started, 2)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
