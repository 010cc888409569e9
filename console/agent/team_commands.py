"""`switchboard tasks ...`: your team's task board from the shell, over the teams REST API."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from console.agent.client import HubClient, HubError

Command = Callable[[argparse.Namespace], int]


def _team_id(client: HubClient) -> str:
    team = client.my_team().get("team")
    if not team:  # the hub found no team for this session: its not_found (exit 3), not a usage error
        raise HubError(
            "not_found", "This session is on no team (a lead creates one and adds you).", status=404
        )
    return team["id"]


def _show(args: argparse.Namespace, tasks: list[dict[str, Any]]) -> None:
    if args.json:
        print(json.dumps(tasks, ensure_ascii=False))
        return
    for t in tasks:
        owner = (t.get("owner") or {}).get("name", "-")
        blocked = f" blocked by {t['blocked_by']}" if t.get("blocked") else ""
        print(f"#{t['id']:<5} {t['status']:<12} {owner:<16} {t['title']}{blocked}")


def add_task_commands(
    tasks: argparse.ArgumentParser,
    common: argparse.ArgumentParser,
    client_for: Callable[..., HubClient],
    guard: Callable[[Command], Command],
) -> None:
    """`tasks list|create|claim|done|release` under the `tasks` parser."""
    from console.agent.commands import EXIT_NOTHING, EXIT_OK

    def cmd_list(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            found = client.tasks(team_id=_team_id(client), status=args.status)
        _show(args, found)
        return EXIT_OK if found else EXIT_NOTHING

    def cmd_create(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            task = client.task_create(
                team_id=_team_id(client),
                title=args.title,
                description=args.description,
                blocked_by=args.blocked_by,
            )
        _show(args, [task])
        return EXIT_OK

    def cmd_claim(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            task = client.task_claim(args.id) if args.id else client.task_claim_next()
        if task is None:
            print("No unblocked pending task to claim.")
            return EXIT_NOTHING
        _show(args, [task])
        return EXIT_OK

    def cmd_done(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            task = client.task_complete(args.id, result=args.result)
        _show(args, [task])
        return EXIT_OK

    def cmd_release(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            task = client.task_release(args.id)
        _show(args, [task])
        return EXIT_OK

    sub = tasks.add_subparsers(dest="tasks_command", required=True)
    p = sub.add_parser("list", parents=[common], help="your team's board (exit 1 when empty)")
    p.add_argument("--status", choices=["pending", "in_progress", "completed"])
    p.set_defaults(func=guard(cmd_list))
    p = sub.add_parser("create", parents=[common], help="add a task")
    p.add_argument("title")
    p.add_argument("--description", default="")
    p.add_argument("--blocked-by", type=int, nargs="*", default=[])
    p.set_defaults(func=guard(cmd_create))
    p = sub.add_parser("claim", parents=[common], help="claim a task by id, or the next unblocked one")
    p.add_argument("id", type=int, nargs="?")
    p.set_defaults(func=guard(cmd_claim))
    p = sub.add_parser("done", parents=[common], help="complete your task")
    p.add_argument("id", type=int)
    p.add_argument("--result", default="")
    p.set_defaults(func=guard(cmd_done))
    p = sub.add_parser("release", parents=[common], help="put your unfinished task back on the board")
    p.add_argument("id", type=int)
    p.set_defaults(func=guard(cmd_release))
