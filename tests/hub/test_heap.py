"""hub.heap: long-lived objects leave the collector's sight once, after the first requests."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from hub.heap import FreezeAfterWarmUp


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_warm_up_freezes_once_after_its_requests(unfrozen: None) -> None:
    warm_up = FreezeAfterWarmUp(after=3)
    survivor = [[] for _ in range(1000)]  # alive through the warm-up: frozen with it

    warm_up.tick()
    warm_up.tick()
    assert gc.get_freeze_count() == 0

    warm_up.tick()
    frozen = gc.get_freeze_count()
    assert frozen >= len(survivor)

    gc.unfreeze()
    warm_up.tick()  # and never again
    assert gc.get_freeze_count() == 0


def test_a_process_with_few_connections_freezes_a_while_after_the_first(unfrozen: None) -> None:
    # A web process that mostly holds WebSockets may never see 200 connections
    warm_up = FreezeAfterWarmUp(after=200, seconds=0.05)

    async def first_connection_then_quiet() -> int:
        warm_up.tick()
        assert gc.get_freeze_count() == 0
        await asyncio.sleep(0.2)
        return gc.get_freeze_count()

    assert asyncio.run(first_connection_then_quiet()) > 0
    gc.unfreeze()
    warm_up.tick()  # and never again
    assert gc.get_freeze_count() == 0
