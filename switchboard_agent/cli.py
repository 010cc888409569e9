"""`switchboard` command line. `serve`, `web` and `manage` run the hub (they need the `hub` extra);
every other command is the agent side and talks to a hub over HTTP.

Exit codes: 0 done, 1 nothing to do, 2 usage error (also: the hub's dependencies are not installed),
3 the hub refused (or has nothing to act on), 4 the hub is unreachable. `--json`, `--url` and
`--session` go before or after the subcommand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from switchboard_agent.home import UnsafeHome
from switchboard_agent.hub_commands import HUB_COMMANDS, add_serve_options, run_hub_command


def build_parser(*, hook_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line; `hook_only`: only `hook`, which an agent client runs on every tool
    call (building the other commands' parsers would cost it more than the rest of its start)."""
    from switchboard_agent.commands import add_agent_commands, add_common_options, add_hook_command

    parser = argparse.ArgumentParser(prog="switchboard", description=__doc__)
    add_common_options(parser, defaults=True)  # also accepted before the subcommand
    sub = parser.add_subparsers(dest="command", required=True)
    if hook_only:
        add_hook_command(sub)
        return parser
    for name, help_text in HUB_COMMANDS.items():
        # Listed for `switchboard --help`; `main` hands their arguments to the hub, which parses them.
        hub_command = sub.add_parser(name, help=help_text, add_help=name == "serve")
        if name == "serve":
            add_serve_options(hub_command)
    add_agent_commands(sub)  # agents, send, inbox, ack, status, tasks, listen, hook, mcp, ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] and arguments[0] in HUB_COMMANDS:
        return run_hub_command(arguments[0], arguments[1:])
    parser = build_parser(hook_only=arguments[:1] == ["hook"])  # as install.hook_argv writes it
    args, rest = parser.parse_known_args(arguments)
    if args.command in HUB_COMMANDS:  # common options came first: `switchboard --json serve ...`
        return run_hub_command(args.command, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.func(args) or 0)
    except UnsafeHome as exc:  # a usage problem of this machine: one line, no traceback
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader closed stdout early (`| head`): not an error, no traceback
        from switchboard_agent.commands import stdout_closed

        stdout_closed()
        return 0


if __name__ == "__main__":
    sys.exit(main())
