"""The hub's own commands: `switchboard serve`, `switchboard web` and `switchboard manage`, entered
through `run_hub_command` from the agent side's command line (`switchboard_agent.hub_commands`, the
agent side's one door to the hub), and the shell lines the console shows for them.

Everything here needs the `hub` extra; the agent side never imports this module otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from switchboard_agent.hub_commands import HUB_COMMANDS, add_serve_options

# What the `hub` extra brings that every hub command needs (checked without importing them: daphne's
# server must not be imported before `switchboard web` and `serve` choose the event loop).
HUB_DEPENDENCIES = ("django", "channels", "daphne", "celery")


def _django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()


def _beside_interpreter(name: str) -> Path | None:
    """`name` in the bin folder of the interpreter running this process (the hub's virtualenv)."""
    beside = Path(sys.executable).parent / name
    return beside if beside.is_file() else None


def manage_command(arguments: str) -> str:
    """The shell line that runs a hub management command (`operator_create NAME`, `backup PATH`, ...)
    with the `switchboard` installed beside this interpreter: by its full path when it is there, so
    the line works whether or not the virtualenv is on PATH."""
    program = _beside_interpreter("switchboard") or "switchboard"
    return f"{program} manage {arguments}"


def first_steps(hub_url: str, home: Path) -> list[str]:
    """The shell lines a newcomer runs to see two agents talk on this hub: put the hub's `switchboard`
    on PATH (its virtualenv's activate script, when there is one), name the hub and its home (where
    the CLI finds the enrollment key) when they are not the defaults, register two sessions and
    send from one to the other."""
    from switchboard_agent.config import DEFAULT_URL

    lines = []
    activate = _beside_interpreter("activate")
    if activate:
        lines.append(f". {activate}")
    if hub_url.rstrip("/") != DEFAULT_URL:
        lines.append(f"export SWITCHBOARD_URL={hub_url.rstrip('/')}")
    if home.expanduser().resolve() != (Path.home() / ".switchboard").resolve():
        lines.append(f"export SWITCHBOARD_HOME={home}")
    return [
        *lines,
        "switchboard register --name alice --save alice",
        "switchboard register --name bob --save bob",
        'switchboard --session alice send bob "hello from alice"',
        "switchboard --session bob inbox --ack",
    ]


def run_manage(arguments: Sequence[str]) -> int:
    """`switchboard manage COMMAND ...`: Django's management commands with the hub's settings, from any
    folder and with the interpreter the hub is installed in (no manage.py or system Python needed)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(["switchboard manage", *arguments])
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
    if not os.environ.get("SWITCHBOARD_PUBLIC_URL"):
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
        shown = f"[{shown}]" if ":" in shown else shown
        os.environ["SWITCHBOARD_PUBLIC_URL"] = f"http://{shown}:{args.port}"
    from console.web import event_loop_or_refusal

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
    federation_start()  # hub key, registry: stale entries out, this hub and its live agents in
    scheduler = None
    if settings.SWITCHBOARD_JOBS != "celery":
        scheduler = EmbeddedScheduler()
        scheduler.start()
    from console.asgi import application

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
        from console import web

        return web.run_web(argv)
    if command == "manage":
        return run_manage(argv)
    return serve(argv)
