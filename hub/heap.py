"""Keep the garbage collector's full passes short in long-running hub processes.

CPython's full (generation 2) collection walks every object the collector tracks, and the process
serves nothing while it does. A web process tracks a great many once its ASGI application is built
(Django, the API's schemas, the database and Redis clients), more after its first requests, and
nearly all of them live as long as the process: walking them again on every full pass would pause
every request in flight. `gc.freeze()` moves the objects alive at that moment out of the
collector's sight (they are never freed, which they would not be anyway), so later full passes
walk only what was made since.

Web processes freeze once the ASGI application is built and once more after their first
`FREEZE_AFTER_REQUESTS` requests or connections, or `FREEZE_AFTER_SECONDS` after the first one,
whichever comes first (a process that mostly holds WebSockets sees few connections), since first
use loads and caches more. Celery's worker process and its pool's processes freeze when they start.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc

FREEZE_AFTER_REQUESTS = 200
FREEZE_AFTER_SECONDS = 60.0


def freeze_long_lived() -> None:
    """Collect what is garbage now, then move every surviving object out of the collector's sight."""
    gc.collect()
    gc.freeze()


class FreezeAfterWarmUp:
    """Call `tick()` once per request or connection: the `after`-th call, or `seconds` after the
    first (when it is made on an event loop), freezes what the first requests left. Once."""

    def __init__(self, after: int = FREEZE_AFTER_REQUESTS, seconds: float = FREEZE_AFTER_SECONDS) -> None:
        self.left, self.seconds = after, seconds
        self.timer: asyncio.TimerHandle | None = None

    def tick(self) -> None:
        if self.left <= 0:
            return
        if self.timer is None:
            with contextlib.suppress(RuntimeError):  # no loop running here: only the count applies
                self.timer = asyncio.get_running_loop().call_later(self.seconds, self.freeze)
        self.left -= 1
        if self.left == 0:
            self.freeze()

    def freeze(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.left = 0
        freeze_long_lived()
