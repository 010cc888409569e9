"""Hold-expiry sweep of 100,000 held messages, against the bare SQL doing the same change.

    .venv/bin/python bench/expiry_sweep.py            # 100,000 holds (about 1-2 minutes)
    .venv/bin/python bench/expiry_sweep.py --smoke    # 5,000 holds

On a fresh PostgreSQL database (and a private Redis for the live events, as in production) it
writes N held deliveries whose deadline has passed, then times the periodic job
`messaging.tasks.sweep_due_deliveries` (the Celery task body, run in this process) until all are
expired. The baseline, measured in the same run on a second set of N holds, is the least work the
same change needs: one UPDATE of the rows plus one INSERT ... SELECT of their audit events.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from common import django_in_process, line, progress, write_result
from harness import RedisServer, database_drop, database_migrated


def make_holds(n: int, label: str) -> Any:
    """N held deliveries from one sender to one stopped recipient, all past their deadline."""
    from django.db import transaction
    from django.utils import timezone

    from messaging.hold_reasons import STOPPED_HOLD
    from messaging.models import Delivery, Message
    from messaging.services.sessions import session_register

    sender = session_register(name=f"sender-{label}").session
    recipient = session_register(name=f"stopped-{label}", status="stopped").session
    past = timezone.now() - timedelta(minutes=5)
    with transaction.atomic():
        for start in range(0, n, 5000):
            chunk = min(5000, n - start)
            messages = Message.objects.bulk_create(
                [
                    Message(sender=sender, text=f"held {start + i}", size=10, sha256=uuid.uuid4().hex * 2)
                    for i in range(chunk)
                ]
            )
            Delivery.objects.bulk_create(
                [
                    Delivery(
                        message=m,
                        recipient=recipient,
                        state="held",
                        hold_reason=STOPPED_HOLD,
                        held_at=past,
                        expires_at=past,
                    )
                    for m in messages
                ]
            )
    return recipient


def baseline_sql(recipient_id: Any) -> float:
    """The same change as bare SQL: one UPDATE and one INSERT ... SELECT of the audit rows."""
    from django.db import connection, transaction

    t = time.perf_counter()
    with transaction.atomic(), connection.cursor() as c:
        c.execute(
            "WITH moved AS (UPDATE messaging_delivery SET state = 'expired', final_at = now(), updated_at = now() "
            "WHERE state = 'held' AND expires_at <= now() AND recipient_id = %s RETURNING id, message_id, recipient_id) "
            "INSERT INTO messaging_auditevent (at, kind, actor, target, message_id, delivery_id, sha256, detail) "
            "SELECT now(), 'delivery.expired', 'hub', recipient_id::text, message_id, id, '', "
            """'{"from": "held", "reason": "hold_expired"}'::jsonb FROM moved""",
            [recipient_id],
        )
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("-n", type=int, default=100_000)
    args = parser.parse_args()
    n = 5_000 if args.smoke else args.n
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-expiry-"))
    redis = RedisServer(workdir).start()
    db = database_migrated()
    try:
        django_in_process(database_url=db, redis_url=redis.url())
        from django.db import connection

        from messaging.models import AuditEvent, Delivery
        from messaging.tasks import sweep_due_deliveries

        progress(f"baseline: {n:,} holds, then one bare UPDATE + INSERT")
        t = time.perf_counter()
        base_recipient = make_holds(n, "baseline")
        setup_s = time.perf_counter() - t
        with connection.cursor() as c:
            c.execute("ANALYZE messaging_delivery")
        baseline = baseline_sql(base_recipient.pk)
        assert Delivery.objects.filter(recipient=base_recipient, state="expired").count() == n

        progress(f"sweep: {n:,} holds, then the periodic job until none is left")
        recipient = make_holds(n, "sweep")
        with connection.cursor() as c:
            c.execute("ANALYZE messaging_delivery")
        t = time.perf_counter()
        runs = 0
        while Delivery.objects.filter(recipient=recipient, state="held").exists() and runs < 20:
            sweep_due_deliveries()
            runs += 1
        sweep = time.perf_counter() - t
        expired = Delivery.objects.filter(recipient=recipient, state="expired").count()
        audited = AuditEvent.objects.filter(kind="delivery.expired", target=str(recipient.pk)).count()
        result = {
            "holds": n,
            "setup_s": round(setup_s, 2),
            "sweep_s": round(sweep, 3),
            "sweep_runs": runs,
            "sweep_per_s": round(n / sweep, 1),
            "baseline_s": round(baseline, 3),
            "baseline_per_s": round(n / baseline, 1),
            "ratio_to_baseline": round(sweep / baseline, 2),
            "expired": expired,
            "audit_events": audited,
        }
    finally:
        from django.db import connections

        connections.close_all()
        database_drop(db)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nHold expiry sweep of {n:,} held messages")
    line(
        "sweep (periodic job, batches of 1,000)",
        f"{result['sweep_s']:.2f} s = {result['sweep_per_s']:,.0f}/s",
    )
    line(
        "baseline: one UPDATE + one audit INSERT",
        f"{result['baseline_s']:.2f} s = {result['baseline_per_s']:,.0f}/s",
    )
    line("ratio to the baseline", f"{result['ratio_to_baseline']:.1f}×")
    line("expired / audit events", f"{expired:,} / {audited:,}")
    write_result("expiry_sweep", result)


if __name__ == "__main__":
    main()
