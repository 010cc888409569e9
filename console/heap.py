"""Keep the garbage collector's full passes short in long-running hub processes.

CPython's full (generation 2) collection walks every object the collector tracks. A web process
tracks about 120,000 once its ASGI application is built (Django, the API's schemas, the database
and Redis clients), more after its first requests, and nearly all of them live as long as the
process. Under load each full pass paused a daphne process for 80-95 ms, every 5-12 s: the
slowest 1% of sends waited on it. `gc.freeze()` moves the objects alive at that moment out of the
collector's sight (they are never freed, which they would not be anyway), so later full passes
walk only what was made since: 1.5-2.6 ms.

Web processes freeze once the ASGI application is built and once more after their first
`FREEZE_AFTER_REQUESTS` requests or connections, which load and cache more on first use. Celery's
worker process and its pool's processes freeze when they start.
"""

from __future__ import annotations

import gc

FREEZE_AFTER_REQUESTS = 200


def freeze_long_lived() -> None:
    """Collect what is garbage now, then move every surviving object out of the collector's sight."""
    gc.collect()
    gc.freeze()


class FreezeAfterWarmUp:
    """Call `tick()` once per request: the `after`-th call freezes what the first requests left."""

    def __init__(self, after: int = FREEZE_AFTER_REQUESTS) -> None:
        self.left = after

    def tick(self) -> None:
        if self.left > 0:
            self.left -= 1
            if self.left == 0:
                freeze_long_lived()
