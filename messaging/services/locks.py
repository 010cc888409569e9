"""Locks on a name rather than a row: PostgreSQL transaction-scoped advisory locks.

For a rule that reads rows and then writes one where no existing row stands for what is read
(an idempotency key answered once, a cap on open invitations per session): every writer that
keeps the rule takes the name's lock first, so the read and the write are one step. A lock is
released when its transaction ends. SQLite needs none: its IMMEDIATE transactions already run
one writer at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from django.db import connection


def lock_id(*parts: str) -> int:
    """The advisory lock id of the name `parts` make (what the rule is about, most general first)."""
    digest = hashlib.sha256(":".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def locks_taken(ids: Iterable[int]) -> None:
    """Hold the advisory locks `ids` until the transaction ends. They are taken in ascending
    order, so two transactions that share some never wait on each other in a cycle. Run inside
    a transaction: outside one a lock would be let go at once."""
    if connection.vendor != "postgresql":
        return
    ordered = sorted(set(ids))
    if not ordered:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("an advisory lock taken outside a transaction would be let go at once")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(id) FROM unnest(%s::bigint[]) AS id", [ordered])
