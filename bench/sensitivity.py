"""What the sensitive tier costs a send: `classify` alone (the call `message_send` makes on every
send), on 1 KB and 100 KB texts an agent might send, with nothing to find (the common case) and
with a secret in it; then its recall and false holds on the test corpora. With `--library`, the same
for detect-secrets (`scan_line` over each line, its default plugins), when it is installed.

    .venv/bin/python bench/sensitivity.py [--rounds 2000] [--library]

No server, no database: a few seconds of one core. A send costs about 1 ms of CPU end to end
here (docs/performance.md), so 10% of a send is 100 µs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")

import django  # noqa: E402

django.setup()

from hub_fixtures.sensitivity_corpus import LEAKS, NEAR_MISSES, PW  # noqa: E402
from messaging.sensitivity import classify  # noqa: E402

# What agents send each other: status, code with the words the rules look for, a log excerpt.
PARAGRAPH = (
    "Finished the migration for the holds table; tests pass (212 passed in 14.2s). The token budget "
    "is fine: max_tokens = 4096 and we stay under it. I did not touch the password reset flow, but "
    'api_key = os.getenv("API_KEY") in settings.py now fails closed when the key is missing. '
    "Next: git push origin sensitivity, then ask the lead to review. Traceback excerpt:\n"
    '  File "/srv/app/auth.py", line 42, in login\n    user = authenticate(username=u, password=p)\n'
    "KeyError: 'SECRET_KEY' -- set DJANGO_SECRET_KEY in the environment (see docs/security.md). "
)


def text_of(size: int, secret: str = "") -> str:
    body = (PARAGRAPH * (size // len(PARAGRAPH) + 1))[: size - len(secret)]
    half = len(body) // 2
    return body[:half] + secret + body[half:]


def per_call_us(call: Callable[[], object], rounds: int) -> str:
    """Microseconds per call over batches of 20 calls (`rounds` calls in all): the best batch (what
    the call costs when nothing else runs on the core) and the median one."""
    batches = []
    for _ in range(max(1, rounds // 20)):
        started = time.perf_counter()
        for _ in range(20):
            call()
        batches.append((time.perf_counter() - started) / 20 * 1e6)
    return f"{min(batches):8.1f} µs (median {statistics.median(batches):8.1f})"


def ours(text: str) -> bool:
    return classify(text).tier == "sensitive"


_LIBRARY_SETTINGS = None


def library() -> Callable[[str], bool] | None:
    """detect-secrets as it scans a file (its default plugins and filters), over the message's
    lines; `scan_line` is its ad hoc mode, which reports every plugin's view of every word."""
    try:
        from detect_secrets.core.scan import _process_line_based_plugins
        from detect_secrets.settings import default_settings
    except ImportError:
        return None
    global _LIBRARY_SETTINGS
    _LIBRARY_SETTINGS = default_settings()  # kept for the run: the plugins are configured once
    _LIBRARY_SETTINGS.__enter__()

    def scan(text: str) -> bool:
        lines = list(enumerate(text.splitlines(), 1))
        return any(True for _ in _process_line_based_plugins(lines=lines, filename="message.txt"))

    return scan


def figures(name: str, scan: Callable[[str], bool], rounds: int) -> None:
    recall = sum(scan(text) for _, text in LEAKS) / len(LEAKS)
    false_holds = sum(scan(text) for _, text in NEAR_MISSES) / len(NEAR_MISSES)
    print(
        f"{name}: recall {recall:.1%} of {len(LEAKS)} leaks, false holds {false_holds:.1%} of {len(NEAR_MISSES)} near misses"
    )
    for size, label in ((1024, "1 KB"), (100 * 1024, "100 KB")):
        n = rounds if size <= 1024 else max(20, rounds // 50)
        clean, leaked = text_of(size), text_of(size, f" DB_PASSWORD={PW} ")
        assert not scan(clean) or name != "ours", "the bench text must hold nothing to find"
        print(
            f"  {label:>6}: {per_call_us(lambda t=clean: scan(t), n)} per call with nothing to find, "
            f"{per_call_us(lambda t=leaked: scan(t), n)} with a password in it"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=2000, help="calls per timed run at 1 KB (100 KB: 1/100)"
    )
    parser.add_argument("--library", action="store_true", help="also measure detect-secrets when installed")
    args = parser.parse_args()
    rounds = max(1, min(args.rounds, 100_000))
    figures("ours", ours, rounds)
    if args.library:
        scan = library()
        if scan is None:
            print("detect-secrets is not installed: pip install detect-secrets")
        else:
            figures("detect-secrets", scan, max(1, rounds // 10))


if __name__ == "__main__":
    main()
