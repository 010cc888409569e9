"""The hub's own commands: `switchboard serve`, `switchboard web` and `switchboard manage`, entered
through `run_hub_command` from the agent side's command line (`switchboard_agent.hub_commands`, the
agent side's one door to the hub).

Everything here needs the `hub` extra; the agent side never imports this module otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Sequence

from switchboard_agent.config import HUB_URL_FILE
from switchboard_agent.home import write_private
from switchboard_agent.hub_commands import HUB_COMMANDS, add_serve_options

# What the `hub` extra brings that every hub command needs (checked without importing them: daphne's
# server must not be imported before `switchboard web` and `serve` choose the event loop).
HUB_DEPENDENCIES = ("django", "channels", "daphne", "celery")


def _django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    import django

    django.setup()


def run_manage(arguments: Sequence[str], *, prog: str = "switchboard manage") -> int:
    """`switchboard manage COMMAND ...`: Django's management commands with the hub's settings, from any
    folder and with the interpreter the hub is installed in (no manage.py or system Python needed).
    Whatever a command changes of the operator accounts (Django's own `createsuperuser` and
    `changepassword` too) is audited as the command-line operator's change."""
    _django_setup()
    from django.core.management import execute_from_command_line

    from messaging.principals import command_line_operator
    from messaging.services.operators import operator_accounts_changed_by

    try:
        with operator_accounts_changed_by(command_line_operator()):
            execute_from_command_line([prog, *arguments])
    except SystemExit as exc:  # a command's CommandError exits 1; --help exits 0
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def serve(argv: Sequence[str]) -> int:
    """`switchboard serve`: apply migrations, then serve HTTP + WebSocket in this process, with
    background jobs in-process."""
    parser = argparse.ArgumentParser(prog="switchboard serve", description=HUB_COMMANDS["serve"])
    add_serve_options(parser)
    args = parser.parse_args(argv)
    os.environ["SWITCHBOARD_ROLE"] = args.role
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    local_url = f"http://[{shown}]:{args.port}" if ":" in shown else f"http://{shown}:{args.port}"
    if not os.environ.get("SWITCHBOARD_PUBLIC_URL"):
        os.environ["SWITCHBOARD_PUBLIC_URL"] = local_url
    from hub.web import event_loop_or_refusal

    loop_name = event_loop_or_refusal("serve")  # before Django imports daphne, whose loop it chooses
    if loop_name is None:
        return 2
    _django_setup()
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from django.conf import settings
    from django.core.management import call_command

    from federation.services.startup import federation_start
    from messaging.credentials import enrollment_key
    from messaging.jobs import EmbeddedScheduler

    call_command("migrate", interactive=False, verbosity=0)
    enrollment_key()  # generated on first start, into $SWITCHBOARD_HOME/enroll.key (0600)
    # Beside the key, where the agent side with this home finds the hub (`config.hub_url`).
    write_private(settings.SWITCHBOARD_HOME / HUB_URL_FILE, local_url + "\n")
    federation_start()  # hub key, registry: stale entries out, this hub and its live agents in
    scheduler = None
    if settings.SWITCHBOARD_JOBS != "celery":
        scheduler = EmbeddedScheduler()
        scheduler.start()
    from hub.asgi import application

    host = args.host
    where = f"http://[{host}]:{args.port}" if ":" in host else f"http://{host}:{args.port}"
    key_source = (
        "SWITCHBOARD_ENROLL_KEY"
        if settings.SWITCHBOARD_ENROLL_KEY
        else str(settings.SWITCHBOARD_HOME / "enroll.key")
    )
    print(f"Switchboard hub on {where}/  (API docs: {where}/api/docs)", flush=True)
    print(
        f"  database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}; "
        f"jobs: {settings.SWITCHBOARD_JOBS}; event loop: {loop_name}; enrollment key: {key_source}",
        flush=True,
    )
    print("  Ctrl-C stops it.", flush=True)
    try:
        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=args.port),
            signal_handlers=True,
            verbosity=0,
            http_timeout=None,
            websocket_handshake_timeout=10,
            application_close_timeout=5,
        ).run()
    finally:
        if scheduler:
            scheduler.stop()
    print("Switchboard hub stopped.", flush=True)
    return 0


def run_hub_command(command: str, argv: Sequence[str]) -> int:
    """Run the hub command `command` (`serve`, `web`, `manage`) with its own arguments. Raises
    ModuleNotFoundError, before anything runs, when the `hub` extra is not installed."""
    for name in HUB_DEPENDENCIES:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    if command == "web":
        from hub import web

        return web.run_web(argv)
    if command == "manage":
        return run_manage(argv)
    return serve(argv)
