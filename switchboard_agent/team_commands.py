"""`switchboard tasks ...` (your team's task board) and `switchboard team ...` (joining a team,
who reads your final answers) from the shell, over the teams REST API."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

from switchboard_agent.client import HubClient, HubError

Command = Callable[[argparse.Namespace], int]


def _team_id(client: HubClient) -> str:
    team = client.my_team().get("team")
    if not team:  # the hub found no team for this session: its not_found (exit 3), not a usage error
        raise HubError(
            "not_found",
            "This session is on no team (`switchboard team join LEAD` asks a lead to add you).",
            status=404,
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
    from switchboard_agent.commands import EXIT_NOTHING, EXIT_OK

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


def _roster_answer(args: argparse.Namespace, body: dict[str, Any]) -> None:
    """Joined (its member id) or waiting for the other side: the hub's sentence on what is open
    (an invitation, or a request to a lead that says nothing of its team)."""
    if args.json:
        print(json.dumps(body, ensure_ascii=False))
    elif body.get("member_id"):
        print(f"{body['name']} joined the team (member {body['member_id']}).")
    else:
        print(body.get("detail") or "Asked; nothing is decided yet.")


def add_team_commands(
    team: argparse.ArgumentParser,
    common: argparse.ArgumentParser,
    client_for: Callable[..., HubClient],
    guard: Callable[[Command], Command],
) -> None:
    """`team invite|join|requests|withdraw|invitations|accept|decline|allow-watcher|watchers|revoke-watcher`."""
    from switchboard_agent.commands import EXIT_NOTHING, EXIT_OK, as_this_session

    def cmd_invite(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            body = client.team_add_member(team_id=_team_id(client), session=args.who, name=args.name)
        _roster_answer(args, body)
        return EXIT_OK

    def cmd_join(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            body = client.team_join(lead=args.lead, name=args.name)
        _roster_answer(args, body)
        return EXIT_OK

    Rows = list[dict[str, Any]]

    def listing(
        fetch: Callable[[HubClient, argparse.Namespace], tuple[Rows, str | None]], line: Callable[[Any], str]
    ) -> Command:
        """A command that prints the rows `fetch` lists (JSON with --json, else `line` of each row)
        and exits 1 when there are none. When `fetch` also names the command that shows the next
        page, a last line says it: on stdout after the rows, on stderr with --json, whose stdout
        stays the JSON list of rows."""

        def cmd(args: argparse.Namespace) -> int:
            with client_for(args) as client:
                found, more = fetch(client, args)
            if args.json:
                print(json.dumps(found, ensure_ascii=False))
            for row in [] if args.json else found:
                print(line(row))
            if more:
                print(f"more: {more}", file=sys.stderr if args.json else sys.stdout)
            return EXIT_OK if found else EXIT_NOTHING

        return cmd

    def invitations_page(client: HubClient, args: argparse.Namespace) -> tuple[Rows, str | None]:
        """A page of open invitations, and the command that shows the next one (None: the last)."""
        page = client.invitations(before=args.before)
        if not page.get("next"):
            return page["invitations"], None
        # Quoted: the cursor is the hub's text, and the line is meant to be pasted into a shell.
        return page["invitations"], as_this_session(
            args, f"team invitations --before {shlex.quote(str(page['next']))}"
        )

    cmd_requests = listing(
        lambda c, _: (c.join_requests(), None),
        lambda r: f"{r['id']}  asked {r['lead_label']} to add you as {r['name']}  (lapses {r['expires_at']})",
    )
    cmd_invitations = listing(
        invitations_page,
        lambda i: (
            f"{i['id']}  team {i['team_name']!r}  {i['session_label']} as {i['name']}  "
            f"(the {i['answer_by']} answers)"
        ),
    )
    cmd_watchers = listing(
        lambda c, _: (c.watchers(), None),
        lambda g: f"#{g['id']:<5} {g['watcher_label']}  (by {g['granted_by']})",
    )

    def cmd_withdraw(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            body = client.join_request_withdraw(args.id)
        print(json.dumps(body, ensure_ascii=False) if args.json else f"Request {args.id} withdrawn.")
        return EXIT_OK

    def answer(accept: bool) -> Command:
        def cmd(args: argparse.Namespace) -> int:
            with client_for(args) as client:
                body = client.invitation_answer(args.id, accept=accept)
            if accept:
                _roster_answer(args, body)
            else:
                print(
                    json.dumps(body, ensure_ascii=False) if args.json else f"Invitation {args.id} declined."
                )
            return EXIT_OK

        return cmd

    def cmd_allow(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            grant = client.watcher_allow(watcher=args.who)
        print(
            json.dumps(grant)
            if args.json
            else f"{grant['watcher_label']} may read your final answers (grant {grant['id']})."
        )
        return EXIT_OK

    def cmd_revoke(args: argparse.Namespace) -> int:
        with client_for(args) as client:
            client.watcher_revoke(args.id)
        print(f"Grant {args.id} withdrawn.")
        return EXIT_OK

    sub = team.add_subparsers(dest="team_command", required=True)
    p = sub.add_parser("invite", parents=[common], help="lead: invite a session; it joins when it accepts")
    p.add_argument("who", metavar="SESSION")
    p.add_argument("--name", help="its name on the roster")
    p.set_defaults(func=guard(cmd_invite))
    p = sub.add_parser("join", parents=[common], help="ask LEAD to add you (joins at once if it invited you)")
    p.add_argument("lead")
    p.add_argument("--name", help="your name on the roster")
    p.set_defaults(func=guard(cmd_join))
    p = sub.add_parser("requests", parents=[common], help="your open requests to join (exit 1: none)")
    p.set_defaults(func=guard(cmd_requests))
    p = sub.add_parser("withdraw", parents=[common], help="withdraw your request to join by id")
    p.add_argument("id")
    p.set_defaults(func=guard(cmd_withdraw))
    p = sub.add_parser(
        "invitations",
        parents=[common],
        help="open invitations to and from you, a page at a time, newest first (exit 1: none)",
    )
    p.add_argument(
        "--before", metavar="ID", help="the page after this invitation (the `more:` line names it)"
    )
    p.set_defaults(func=guard(cmd_invitations))
    for verb, accept in (("accept", True), ("decline", False)):
        p = sub.add_parser(verb, parents=[common], help=f"{verb} an invitation by id")
        p.add_argument("id")
        p.set_defaults(func=guard(answer(accept)))
    p = sub.add_parser("allow-watcher", parents=[common], help="let a session read your final answers")
    p.add_argument("who", metavar="SESSION")
    p.set_defaults(func=guard(cmd_allow))
    p = sub.add_parser("watchers", parents=[common], help="who may read your final answers (exit 1: none)")
    p.set_defaults(func=guard(cmd_watchers))
    p = sub.add_parser("revoke-watcher", parents=[common], help="withdraw a watcher grant by id")
    p.add_argument("id", type=int)
    p.set_defaults(func=guard(cmd_revoke))
