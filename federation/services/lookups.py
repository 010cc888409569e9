"""How long this hub remembers what it asked another hub or the relay: "do you host X?", "who
holds X?", the agents a hub lists. One rule for every such memory (`LookupCache`):

- an answer the hub gave itself, signed with the key this hub holds for it (a 2xx, or a signed
  4xx refusal), is its word: kept SWITCHBOARD_HOSTS_CACHE_SECONDS, never past what it rests on
  (a relay's yes, its lease statement);
- no answer (unreachable, a 5xx, an answer the hub did not sign: someone on the path, or no key
  held to ask with) only UNANSWERED_LOOKUP_SECONDS: a burst of lookups waits on a hub that is down
  once, and nobody but the hub itself keeps its names unknown here for longer than that.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

from django.conf import settings

K = TypeVar("K")
V = TypeVar("V")

UNANSWERED_LOOKUP_SECONDS = 5.0


class LookupCache(Generic[K, V]):
    """What this hub remembers of its lookups at other hubs (in process memory: a lookup is a
    question any process may ask again), each until the rule above says."""

    def __init__(self) -> None:
        self._kept: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> tuple[bool, V | None]:
        """(True, what was remembered) while `key`'s lookup is remembered; (False, None) when it
        must be asked again."""
        hit = self._kept.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    def answered(self, key: K, value: V, *, good_for: float | None = None) -> None:
        """Remember the hub's own answer to `key`'s lookup: SWITCHBOARD_HOSTS_CACHE_SECONDS, or
        `good_for` seconds when what the answer rests on ends sooner."""
        seconds = float(settings.SWITCHBOARD_HOSTS_CACHE_SECONDS)
        if good_for is not None:
            seconds = min(seconds, good_for)
        self._kept[key] = (time.monotonic() + seconds, value)

    def unanswered(self, key: K, value: V) -> None:
        """Remember that `key`'s lookup got no answer of the hub's own (`value`: what counts
        meanwhile, nothing found) for UNANSWERED_LOOKUP_SECONDS (never longer than an answer)."""
        seconds = min(UNANSWERED_LOOKUP_SECONDS, float(settings.SWITCHBOARD_HOSTS_CACHE_SECONDS))
        self._kept[key] = (time.monotonic() + seconds, value)

    def clear(self) -> None:
        self._kept.clear()
