"""The agent-facing `switchboard` subcommands: they talk to a hub over HTTP (never to its database).

Identity: `SWITCHBOARD_TOKEN` (a session token), or `--session KEY` (a session saved by
`switchboard register --save KEY` or by the Claude Code hooks). Human output by default, `--json`
for scripts. Exit codes:

  0  done (also when the reader of the output closed it early, as `| head -1` does)
  1  nothing to do (empty inbox, nothing acked, empty board)
  2  usage error (bad arguments, no identity)
  3  the hub refused the request or has nothing to act on (its error code and sentence are
     printed: `not_found` when, say, this session is on no team)
  4  the hub could not be reached (retry later)

The common options (`--json`, `--url`, `--session`) may come before or after the subcommand.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from switchboard_agent.client import HubClient, HubError, HubUnreachable, NotConfigured
from switchboard_agent.hints import for_shell

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_HUB, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


class UsageError(Exception):
    pass


def _client(args: argparse.Namespace, *, need_token: bool = True) -> HubClient:
    from switchboard_agent.config import session_load

    token = os.environ.get("SWITCHBOARD_TOKEN", "").strip() or None
    url = getattr(args, "url", None)
    if getattr(args, "session", None):
        saved = session_load(args.session)
        if saved is None or saved.ended:
            raise UsageError(f"No saved session {args.session!r} in $SWITCHBOARD_HOME/sessions.")
        token, url = saved.token, url or saved.hub
    if need_token and not token and "SWITCHBOARD_TOKEN" in os.environ:
        raise UsageError(
            "SWITCHBOARD_TOKEN is set but empty: the command that set it printed no token (was "
            "`switchboard` on PATH? it is .venv/bin/switchboard in a clone). Register again, or use "
            "`switchboard register --save KEY` and `--session KEY`."
        )
    if need_token and not token:
        raise UsageError(
            "No session: set SWITCHBOARD_TOKEN or pass --session KEY (see `switchboard register`)."
        )
    return HubClient(url, token)


def stdout_closed() -> None:
    """The reader closed stdout (`| head -1`): send what is left to /dev/null, so neither a later
    print nor the interpreter's own flush at exit fails with a BrokenPipe traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _out(text: str) -> bool:
    """Print `text` to stdout and flush it; False when the reader has closed the pipe."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        stdout_closed()
        return False


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    _out(json.dumps(data, ensure_ascii=False) if args.json else human)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def as_this_session(args: argparse.Namespace, command: str) -> str:
    """`command` as a shell command acting as the same session as this one (its --session and --url)."""
    import shlex

    extra = "".join(
        f" --{flag} {shlex.quote(value)}"
        for flag, value in (("session", getattr(args, "session", None)), ("url", getattr(args, "url", None)))
        if value
    )
    return f"switchboard {command}{extra}"


# --- commands -----------------------------------------------------------------------------------
def cmd_register(args: argparse.Namespace) -> int:
    from switchboard_agent.config import SavedSession, session_name, session_save

    with _client(args, need_token=False) as client:
        body = client.register(
            name=args.name or session_name(),
            cwd=os.getcwd(),
            kind=args.kind,
            peer_address=f"uds:{os.path.abspath(args.socket)}" if args.socket else "",
        )
    if args.save:
        saved = SavedSession(
            key=args.save,
            hub=client.url,
            token=body["token"],
            id=body["id"],
            name=body["name"],
            ref=body["ref"],
        )
        saved.cwd, saved.status = os.getcwd(), body["status"]
        session_save(saved)
    # stdout carries only what a script consumes (`eval "$(switchboard register)"`); the note is stderr's.
    saved_as = f" Saved as session {args.save!r}." if args.save else ""
    print(f"Registered {body['name']} [{body['ref']}].{saved_as}", file=sys.stderr)
    if args.json:
        _out(json.dumps(body, ensure_ascii=False))
    elif not args.save:
        _out(f"export SWITCHBOARD_TOKEN={body['token']}")
    return EXIT_OK


def cmd_agents(args: argparse.Namespace) -> int:
    with _client(args) as client:
        agents = client.agents(name=args.name, include_exited=args.all)
    _emit(args, agents, _table(agents, ["name", "ref", "status", "addressable", "kind", "cwd"]))
    return EXIT_OK


def cmd_send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.message == "-" else args.message
    with _client(args) as client:
        sent = client.send(
            to=args.to,
            message=text,
            summary=args.summary,
            idempotency_key=args.key,
            priority="urgent" if args.urgent else "normal",
            in_reply_to=args.reply_to,
        )
    step = for_shell(sent.get("hint"), lambda sub: as_this_session(args, sub), id=sent["id"])
    _emit(args, sent, f"{sent['result']}{step}\nmessage id {sent['id']}")
    return EXIT_OK


def cmd_inbox(args: argparse.Namespace) -> int:
    from switchboard_agent.delivery_text import render_messages

    with _client(args) as client:
        try:
            messages = client.inbox(wait=args.wait, limit=args.limit, include_unacked=args.unacked)
        except HubError as exc:
            if client.pull_unsettled and not args.unacked:
                exc.detail += (
                    " Messages may have been handed over before the failure: "
                    f"`{as_this_session(args, 'inbox --unacked')}` shows them."
                )
            raise
        if not messages:
            if args.json:  # a script reads JSON on stdout whatever the count, as every listing gives
                _out("[]")
            print("No messages waiting.", file=sys.stderr)
            return EXIT_NOTHING
        again = as_this_session(args, "inbox --unacked")
        shown = _out(
            json.dumps(messages, ensure_ascii=False)
            if args.json
            else render_messages(messages, budget=10**9, how_to_reread=f"run `{again}`")
        )
        if not shown:  # acked only once printed: what the reader never got stays unacked, not lost
            print(
                f"switchboard: the output was closed early; {len(messages)} message(s) stay unacked: "
                f"`{again}` shows them again.",
                file=sys.stderr,
            )
        elif args.ack:
            client.ack([m["id"] for m in messages])
    return EXIT_OK


def cmd_ack(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.ack(args.ids)
    others = len(result["unknown"]) + len(result["not_acked"])
    human = f"acked {len(result['acked'])}, already read {len(result['already_read'])}, not yours or unknown {others}"
    _emit(args, result, human)
    return EXIT_OK if result["acked"] else EXIT_NOTHING


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.message_id:
            status = client.message_status(args.message_id)
            human = (
                f"{status['status']}  (to {status['to']['name']} [{status['to']['ref']}])"
                if status.get("to")
                else status["status"]
            )
            human += "".join(f"\n  {h['at']}  {h['event']}" for h in status.get("history", []))
            _emit(args, status, human)
            return EXIT_OK
        me = client.set_status(args.set, final_answer=args.final_answer) if args.set else client.me()
    _emit(args, me, f"{me['name']} [{me['ref']}] is {me['status']}")
    return EXIT_OK


def cmd_deregister(args: argparse.Namespace) -> int:
    with _client(args) as client:
        me = client.deregister()
    if args.session:  # its token no longer works: keep no file that looks like a usable session
        from switchboard_agent.config import session_forget

        session_forget(args.session)
    _emit(args, me, f"{me['name']} [{me['ref']}] has exited.")
    return EXIT_OK


def cmd_listen(args: argparse.Namespace) -> int:
    from switchboard_agent.listen import listen

    # The listener takes only frames for its own session: the one it registers, else the one its
    # token (SWITCHBOARD_TOKEN or --session) stands for, as the hub says.
    client, saved_key = None, None
    if args.register:
        saved_key, client, body = _listener_registered(args)
        print(
            f"Registered {body['name']} [{body['ref']}] with socket {args.socket}.",
            file=sys.stderr,
            flush=True,
        )
    else:
        try:
            own = _client(args)
        except UsageError as exc:
            raise UsageError(
                f"{exc} `listen` takes the messages of one session: register it with --register, or "
                "name the session registered with this socket."
            ) from exc
        with own:
            body = own.me()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: clean up, deregister
    try:
        taken = listen(
            args.socket,
            session_id=str(body["id"]),
            out_file=args.out,
            as_json=args.json,
            count=args.count,
            seconds=args.seconds,
        )
    except KeyboardInterrupt:
        taken = 0
    finally:
        if client is not None:
            _deregister_quietly(client)
        if saved_key is not None:
            from switchboard_agent.config import session_forget

            session_forget(saved_key)
    return EXIT_OK if taken or args.count is None else EXIT_NOTHING


def _listener_registered(args: argparse.Namespace) -> tuple[str, HubClient, dict[str, Any]]:
    """Register the session `listen --register` listens for, saved under a key of its socket and
    this process, and tied to this process: a listener started after one that was killed (and never
    deregistered) first ends that one's session (`sessions_reap`, those of its name first), so the
    name has one open session, not two.
    Returns the saved session's key, a client acting as the session, and its summary."""
    import hashlib

    from switchboard_agent.config import hub_url, session_lock, session_name
    from switchboard_agent.identity import anchor_alive, client_anchor
    from switchboard_agent.registration import session_register_saved

    path = os.path.abspath(args.socket)
    anchor = client_anchor(os.getpid())
    # One saved session per listener process: one a killed listener left is another's to end.
    key = f"listen-{hashlib.sha256(path.encode()).hexdigest()[:12]}-{anchor.replace(':', '-')}"
    url = (getattr(args, "url", None) or hub_url()).rstrip("/")
    with session_lock(key):
        saved = session_register_saved(
            lambda token: HubClient(url, token),
            key=key,
            hub=url,
            name=args.name or session_name(),
            cwd=os.getcwd(),
            kind="listener",
            anchor=anchor,
            alive=anchor_alive,
            status="idle",
            peer_address=f"uds:{path}",
        )
    client = HubClient(url, saved.token)
    return key, client, {"id": saved.id, "name": saved.name, "ref": saved.ref}


def _deregister_quietly(client: HubClient, attempts: int = 3) -> None:
    """End a session this command registered; a busy hub gets a short, bounded retry."""
    import time

    try:
        for attempt in range(attempts):
            try:
                client.deregister()
                return
            except HubError as exc:
                if not exc.retryable or attempt == attempts - 1:
                    print(f"switchboard: could not deregister: {exc.detail}", file=sys.stderr)
                    return
                time.sleep(0.2 * (attempt + 1))
    finally:
        client.close()


def cmd_doctor(args: argparse.Namespace) -> int:
    """Whether this machine's agent side can work: its home (what is wrong there and the commands
    that fix it), the hub it would use and whether that hub answers. Exit 2 for an unsafe home (the
    hooks and MCP server refuse it too), 4 for a hub out of reach, else 0."""
    from switchboard_agent.config import enroll_key, home_problems, hub_url

    problems = home_problems()
    home = os.environ.get("SWITCHBOARD_HOME") or "~/.switchboard"
    report: dict[str, Any] = {
        "home": home,
        "home_ok": not problems,
        "home_problems": [{"path": str(p.path), "problem": p.problem, "fix": p.fix} for p in problems],
    }
    lines = [
        f"home: {home}: " + ("ok" if not problems else "NOT SAFE; the hooks and MCP server will not use it")
    ]
    lines += [f"  {p}" for p in problems]
    code = EXIT_USAGE if problems else EXIT_OK
    if not problems:
        url = getattr(args, "url", None) or hub_url()
        report |= {"hub": url, "enroll_key": enroll_key(url) is not None}
        try:
            with HubClient(url, None) as client:
                client.call("GET", "ping")
            answers = "answers"
        except HubUnreachable as exc:
            answers, code = f"NOT REACHED: {exc.detail}", EXIT_UNREACHABLE
        except HubError as exc:
            answers = "answers" if exc.status == 401 else f"answers HTTP {exc.status} [{exc.code}]"
        report["hub_answers"] = answers
        lines.append(f"hub: {url}: {answers}")
        key = "found" if report["enroll_key"] else "none (set SWITCHBOARD_ENROLL_KEY to register sessions)"
        lines.append(f"enrollment key for it: {key}")
    _emit(args, report, "\n".join(lines))
    return code


def cmd_hook(args: argparse.Namespace) -> int:
    from switchboard_agent.hooks import main

    if args.url:  # the hub the installed hook line names (the same one as its MCP server's)
        os.environ["SWITCHBOARD_URL"] = args.url
    return main(client_name=args.client, payload=args.payload)


def cmd_install_hooks(args: argparse.Namespace) -> int:
    from switchboard_agent.install import install, show

    report = install(
        client=args.client,
        scope=args.scope,
        project_dir=Path(args.project_dir).resolve(),
        write=args.write,
        url=args.url,
        approve_tools=not args.ask_before_tools,
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(show(report, written=args.write))
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    from switchboard_agent.mcp_server import main

    return main()


# --- wiring ---------------------------------------------------------------------------------------
def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except UsageError as exc:
            print(f"switchboard: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except NotConfigured as exc:
            print(f"switchboard: {exc.detail} [{exc.code}]", file=sys.stderr)
            return EXIT_USAGE
        except HubUnreachable as exc:
            print(f"switchboard: {exc.detail} Retry later.", file=sys.stderr)
            return EXIT_UNREACHABLE
        except HubError as exc:
            if getattr(args, "json", False):
                print(json.dumps({"error": exc.code, "detail": exc.detail, **exc.data}), file=sys.stderr)
            else:
                step = for_shell(exc.data.get("hint"), lambda sub: as_this_session(args, sub))
                print(f"switchboard: {exc.detail}{step} [{exc.code}]", file=sys.stderr)
            return EXIT_HUB

    return run


def add_common_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """`--json`, `--url`, `--session` on `parser`. The top-level parser sets the defaults; each
    subcommand's copy sets none (SUPPRESS), so an option given before the subcommand is kept."""
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument("--json", action="store_true", help="print JSON for scripts", **keep)
    parser.add_argument("--url", help="the hub (default: $SWITCHBOARD_URL or http://127.0.0.1:8765)", **keep)
    parser.add_argument(
        "--session", metavar="KEY", help="act as a saved session instead of $SWITCHBOARD_TOKEN", **keep
    )


def add_hook_command(sub: Any) -> None:
    """`switchboard hook` on the subparsers `sub` (its own options: no --json, no --session)."""
    p = sub.add_parser(
        "hook", help="handle one agent client hook event (JSON on stdin, or Codex's as an argument); exits 0"
    )
    p.add_argument("--client", choices=["claude", "gemini", "codex"], default="claude")
    p.add_argument("--url", help="the hub (default: $SWITCHBOARD_URL or http://127.0.0.1:8765)")
    p.add_argument("payload", nargs="?", help="the event's JSON (Codex's notify passes it here)")
    p.set_defaults(func=cmd_hook)


def add_agent_commands(sub: Any) -> None:
    """Add the agent-side subcommands to the `switchboard` parser's subparsers (whose parser has
    `add_common_options(..., defaults=True)`)."""
    common = argparse.ArgumentParser(add_help=False)
    add_common_options(common, defaults=False)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, parents=[common], help=help, description=help)
        parser.set_defaults(func=_guard(fn))
        return parser

    p = add("register", cmd_register, "register a session and print its token (or --save it)")
    p.add_argument("--name", help="default: $SWITCHBOARD_NAME or this folder's name")
    p.add_argument("--kind", default="script")
    p.add_argument("--socket", help="deliver messages to this Unix socket (see `listen`)")
    p.add_argument(
        "--save", metavar="KEY", help="keep the token in $SWITCHBOARD_HOME/sessions/KEY.json (0600)"
    )

    p = add("agents", cmd_agents, "list agent sessions on the hub")
    p.add_argument("--name", help="only names starting with this")
    p.add_argument("--all", action="store_true", help="include sessions that have exited")

    p = add("send", cmd_send, "send a plain-text message to one session")
    p.add_argument("to", help="a name, `name [ref]`, a ref, or `lead`")
    p.add_argument("message", help="the text, or - to read it from stdin")
    p.add_argument("--summary", default="")
    p.add_argument("--urgent", action="store_true")
    p.add_argument("--key", help="idempotency key: a retried send with the same key is not sent twice")
    p.add_argument("--reply-to", help="the id of the message this answers")

    p = add("inbox", cmd_inbox, "pull waiting messages (exit 1 when there are none)")
    p.add_argument("--wait", type=float, default=0, help="long-poll up to this many seconds")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--unacked", action="store_true", help="also show delivered messages not yet acked")
    p.add_argument("--ack", action="store_true", help="mark what was shown as read")

    p = add("ack", cmd_ack, "mark messages read by id (exit 1 when none was acked)")
    p.add_argument("ids", nargs="+")

    p = add("status", cmd_status, "show a message's state, or show / set this session's status")
    p.add_argument("message_id", nargs="?")
    p.add_argument("--set", choices=["busy", "idle", "stopped", "exited"])
    p.add_argument("--final-answer")

    add("deregister", cmd_deregister, "end this session on the hub (its token stops working)")

    p = add("listen", cmd_listen, "receive messages on a Unix socket: print them or append them to a file")
    p.add_argument("--socket", required=True, help="the socket path to listen on")
    p.add_argument("--out", help="append each frame as a JSON line to this file instead of printing")
    p.add_argument(
        "--register",
        action="store_true",
        help="register a session whose address is this socket (else: the session of $SWITCHBOARD_TOKEN or --session)",
    )
    p.add_argument("--name", help="the registered session's name")
    p.add_argument("--count", type=int, help="stop after this many messages")
    p.add_argument("--seconds", type=float, help="stop after this many seconds")

    add("doctor", cmd_doctor, "check this machine's Switchboard home (and how to fix it) and its hub")

    add_hook_command(sub)

    p = add("install-hooks", cmd_install_hooks, "print (or --write) an agent client's hooks and MCP config")
    p.add_argument("--client", choices=["claude", "codex", "gemini"], default="claude")
    p.add_argument("--scope", choices=["project", "local", "user"], default="project")
    p.add_argument("--project-dir", default=".")
    p.add_argument("--write", action="store_true", help="merge into the settings files instead of printing")
    p.add_argument(
        "--ask-before-tools",
        action="store_true",
        help="leave the Switchboard tools' approval to the client, which asks before each call "
        "(default: approve them, and only them, in the settings file); removes an approval written before",
    )

    p = sub.add_parser("mcp", help="run the MCP server on stdio (for Claude Code or any MCP client)")
    p.set_defaults(func=cmd_mcp)

    from switchboard_agent.team_commands import add_task_commands, add_team_commands

    tasks = sub.add_parser("tasks", help="your team's task board: list, create, claim, done, release")
    add_task_commands(tasks, common, _client, _guard)
    team = sub.add_parser("team", help="join a team: invite, join, invitations, accept, decline; watchers")
    add_team_commands(team, common, _client, _guard)
