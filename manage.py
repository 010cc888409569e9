#!/usr/bin/env python
"""Django's command-line utility for administrative tasks: `switchboard manage`, from a clone."""

import sys


def main() -> None:
    from hub.cli import run_manage

    sys.exit(run_manage(sys.argv[1:], prog="manage.py"))


if __name__ == "__main__":
    main()
