"""Operator alerts: find what needs a person, post it to the configured webhook once, and let an
operator acknowledge it.

`alerts_run` is the whole job, run by the periodic job runner (Celery beat in production, the
embedded scheduler in `switchboard serve`) and started at once when a send makes an escalated hold
(`on_escalated_holds`, via messaging's `escalated_holds_created`). It never runs on a request
path: the send that made the hold has answered before the post starts.

1. `alerts_detect` inserts one Alert row per thing to tell (a new escalated hold; a hold waiting
   for an operator that expires within SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS; a running session
   silent past SWITCHBOARD_DEAD_AFTER_SECONDS), skipping what an operator acknowledged. The
   unique constraints make it once per hold and kind, and once per silence of a session.
2. `alerts_send_due` claims the due rows (a compare-and-set, so two runs never post one row),
   drops those settled meanwhile (decided, expired, heard from again, acknowledged), and posts
   one alert per kind through messaging.outbound (the hub's rule for URLs it calls: private and
   loopback addresses only when allowed), with a short timeout. A failure is retried with
   backoff up to SWITCHBOARD_ALERT_ATTEMPTS tries. Each post is audited; the audit and the alert
   name no URL, and no alert carries message text.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from alerts.models import Acknowledgement, Alert, AlertKind, AlertState
from alerts.payloads import AlertItem, alert_post
from messaging.errors import NotFound, SwitchboardError
from messaging.hold_reasons import STOPPED_HOLD, hold_reason_label
from messaging.jobs import enqueue
from messaging.liveness import dead_before, dead_sessions_q, session_is_dead
from messaging.models import REMOTE_KIND, AgentSession, Delivery
from messaging.outbound import outbound_post
from messaging.principals import Principal
from messaging.sensitivity import match_labels
from messaging.services.audit import audit_event
from messaging.states import DeliveryState

log = logging.getLogger(__name__)

S = DeliveryState
BATCH = 500  # rows one run detects per kind, and claims
# A session silent for longer than this past the dead timeout is old news, not an alert: turning
# alerts on does not page for every session that stopped answering last month.
DEAD_LOOKBACK = timedelta(days=1)
HOLD_KINDS = (AlertKind.ESCALATED_HOLD, AlertKind.HOLD_EXPIRING)
# Alerts and acknowledgements are kept this long, then deleted: long past any hold (24 h at most)
# and past DEAD_LOOKBACK, so nothing is alerted again for want of them.
KEEP = timedelta(days=7)


def alerts_enabled(kind: str) -> bool:
    """True when a webhook is configured and `kind` is one of SWITCHBOARD_ALERT_ON."""
    return bool(settings.SWITCHBOARD_ALERT_WEBHOOK_URL) and kind in settings.SWITCHBOARD_ALERT_ON


def on_escalated_holds(sender: Any, delivery_ids: list[int], **_: Any) -> None:
    """A send made escalated holds (after its commit): run the alerts job now, in the background,
    rather than at the next tick."""
    if alerts_enabled(AlertKind.ESCALATED_HOLD):
        enqueue("alerts.tasks.alerts_run")


def alerts_run(*, now: datetime | None = None) -> dict[str, int]:
    """Detect what to tell, then post what is due. Idempotent; safe to run twice at once."""
    if not settings.SWITCHBOARD_ALERT_WEBHOOK_URL:
        return {"detected": 0, "posted": 0}
    now = now or timezone.now()
    Alert.objects.filter(created_at__lt=now - KEEP).delete()
    Acknowledgement.objects.filter(at__lt=now - KEEP).delete()
    detected = alerts_detect(now=now)
    return {"detected": detected, "posted": alerts_send_due(now=now)}


def _hold_acknowledged(delivery: str = "pk") -> Exists:
    """Whether an operator acknowledged the hold that the outer row's `delivery` field names."""
    return Exists(Acknowledgement.objects.filter(delivery_id=OuterRef(delivery)))


def _silence_acknowledged(session: str = "pk", silent_since: str = "last_seen") -> Exists:
    """Whether an operator acknowledged the session's silence that began at `silent_since`: an
    acknowledgement made after the session was last heard from covers that silence."""
    return Exists(
        Acknowledgement.objects.filter(session_id=OuterRef(session), at__gte=OuterRef(silent_since))
    )


def alerts_detect(*, now: datetime) -> int:
    """Insert an Alert for each thing to tell that has none yet. Returns how many were new."""
    rows: list[Alert] = []
    for kind, holds in (
        (AlertKind.ESCALATED_HOLD, Delivery.objects.filter(state=S.HELD, escalate="required")),
        (
            AlertKind.HOLD_EXPIRING,
            Delivery.objects.filter(
                state=S.HELD,
                expires_at__gt=now,
                expires_at__lte=now + timedelta(seconds=settings.SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS),
            ).exclude(hold_reason=STOPPED_HOLD),
        ),
    ):
        if kind not in settings.SWITCHBOARD_ALERT_ON:
            continue
        ids = (
            holds.filter(~_hold_acknowledged())
            .filter(~Exists(Alert.objects.filter(kind=kind, delivery_id=OuterRef("pk"))))
            .order_by("id")
            .values_list("id", flat=True)[:BATCH]
        )
        rows += [Alert(kind=kind, delivery_id=i) for i in ids]
    if AlertKind.SESSION_DEAD in settings.SWITCHBOARD_ALERT_ON:
        dead = (
            AgentSession.objects.filter(dead_sessions_q(now))
            .filter(last_seen__gte=dead_before(now) - DEAD_LOOKBACK)
            .exclude(kind=REMOTE_KIND)
            .filter(~_silence_acknowledged())
            .filter(
                ~Exists(
                    Alert.objects.filter(
                        kind=AlertKind.SESSION_DEAD, session_id=OuterRef("pk"), seen=OuterRef("last_seen")
                    )
                )
            )
            .order_by("last_seen")
            .values_list("id", "last_seen")[:BATCH]
        )
        rows += [Alert(kind=AlertKind.SESSION_DEAD, session_id=i, seen=seen) for i, seen in dead]
    if rows:
        Alert.objects.bulk_create(rows, ignore_conflicts=True)  # another run may have made some
    return len(rows)


def _due(now: datetime) -> Q:
    return Q(state=AlertState.PENDING) & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))


def alerts_send_due(*, now: datetime) -> int:
    """Claim the due alerts, drop the settled, post one alert per kind. Returns how many alerts
    (rows) a webhook took."""
    ids = list(Alert.objects.filter(_due(now)).order_by("id").values_list("id", flat=True)[:BATCH])
    if not ids:
        return 0
    claim = uuid.uuid4()
    # The claim lasts past the longest post; a run that dies holding it leaves the rows due again.
    lease = now + timedelta(seconds=4 * settings.SWITCHBOARD_ALERT_TIMEOUT_SECONDS + 30)
    Alert.objects.filter(_due(now), pk__in=ids).update(claim=claim, next_attempt_at=lease)
    claimed = list(
        Alert.objects.filter(claim=claim, state=AlertState.PENDING)
        .select_related("delivery__message__sender", "delivery__recipient", "session")
        .annotate(
            hold_acknowledged=_hold_acknowledged("delivery_id"),
            silence_acknowledged=_silence_acknowledged("session_id", "seen"),
        )
        .order_by("id")
    )
    by_kind: dict[str, list[tuple[Alert, AlertItem]]] = defaultdict(list)
    settled = []
    for alert in claimed:
        item = _item(alert, now)
        if item is None:
            settled.append(alert.pk)
        else:
            by_kind[alert.kind].append((alert, item))
    if settled:
        Alert.objects.filter(pk__in=settled, claim=claim).update(state=AlertState.SKIPPED, claim=None)
    taken = 0
    for kind in AlertKind.values:
        if by_kind.get(kind):
            taken += _post(kind, by_kind[kind], claim=claim, now=now)
    return taken


def _item(alert: Alert, now: datetime) -> AlertItem | None:
    """What the alert says about its hold or session, or None when there is nothing left to say
    (decided, expired, heard from again, acknowledged). `alert` carries the acknowledgement
    annotations of `alerts_send_due`'s query."""
    if alert.hold_acknowledged or alert.silence_acknowledged:  # type: ignore[attr-defined]
        return None
    if alert.kind in HOLD_KINDS:
        d = alert.delivery
        if d is None or d.state != S.HELD or (d.expires_at is not None and d.expires_at <= now):
            return None
        sender = d.message.sender
        return AlertItem(
            kind=alert.kind,
            subject="hold",
            id=str(d.pk),
            who=f"{sender.label if sender else 'the hub'} → {d.recipient.label}",
            why=hold_reason_label(d.hold_reason, match_labels(d.message.matched)),
            at=d.expires_at.isoformat() if d.expires_at else "",
            url=console_link(f"/alerts/holds/{d.pk}/"),
        )
    session = alert.session
    if session is None or session.last_seen != alert.seen or not session_is_dead(session, now=now):
        return None
    silent = int((now - session.last_seen).total_seconds() // 60)
    return AlertItem(
        kind=alert.kind,
        subject="session",
        id=str(session.id),
        who=f"{session.label} ({session.kind})",
        why=f"{session.status} but silent for {silent} min",
        at=session.last_seen.isoformat(),
        url=console_link(f"/alerts/sessions/{session.id}/"),
    )


def console_link(path: str) -> str:
    """An absolute link to a console page, or "" when the hub has no console URL to give."""
    base = settings.SWITCHBOARD_ALERT_CONSOLE_URL
    return f"{base}{path}" if base else ""


def retry_delay(attempts: int) -> timedelta | None:
    """Wait after the `attempts`-th failed post (10 s, 20 s, 40 s, ...; at most 5 min), or None
    once SWITCHBOARD_ALERT_ATTEMPTS tries are used up."""
    if attempts >= settings.SWITCHBOARD_ALERT_ATTEMPTS:
        return None
    return timedelta(seconds=min(300, 10 * 2 ** (attempts - 1)))


def _post(kind: str, batch: list[tuple[Alert, AlertItem]], *, claim: uuid.UUID, now: datetime) -> int:
    """Post one alert about `batch` and record the outcome on its rows and in the audit."""
    items = [item for _alert, item in batch]
    permanent = False
    try:
        post = alert_post(
            webhook_url=settings.SWITCHBOARD_ALERT_WEBHOOK_URL,
            fmt=settings.SWITCHBOARD_ALERT_FORMAT,
            kind=kind,
            items=items,
            lead_seconds=settings.SWITCHBOARD_ALERT_EXPIRY_LEAD_SECONDS,
            hub_name=settings.SWITCHBOARD_HUB_NAME,
            list_url=console_link("/holds/" if kind in HOLD_KINDS else "/"),
        )
        # The URL is checked again at every call (its name may resolve elsewhere now).
        response = outbound_post(post.url, json=post.body, timeout=settings.SWITCHBOARD_ALERT_TIMEOUT_SECONDS)
        outcome = f"HTTP {response.status_code}"
        ok = 200 <= response.status_code < 300
        # A redirect is not followed and a 4xx will not change: only 5xx, 408 and 429 are retried.
        permanent = not ok and response.status_code < 500 and response.status_code not in (408, 429)
    except SwitchboardError as exc:  # the hub may not call it, or it is not a URL: no retry helps
        outcome, ok, permanent = f"refused: {exc.code}", False, True
    except httpx.HTTPError as exc:  # the error's name only: its text may hold the URL
        outcome, ok = type(exc).__name__, False
    attempts = max(alert.attempts for alert, _item in batch) + 1
    rows = Alert.objects.filter(pk__in=[alert.pk for alert, _item in batch], claim=claim)
    delay = None if ok or permanent else retry_delay(attempts)
    with transaction.atomic():
        if ok:
            rows.update(
                state=AlertState.SENT, sent_at=now, attempts=F("attempts") + 1, claim=None, last_error=""
            )
        elif delay is not None:
            rows.update(
                next_attempt_at=now + delay, attempts=F("attempts") + 1, claim=None, last_error=outcome
            )
        else:
            rows.update(state=AlertState.FAILED, attempts=F("attempts") + 1, claim=None, last_error=outcome)
        audit_event(
            "alert.sent" if ok else "alert.failed",
            actor="hub",
            target=kind,
            detail={
                "format": settings.SWITCHBOARD_ALERT_FORMAT,
                "count": len(items),
                "ids": [item.id for item in items],
                "attempt": attempts,
                "outcome": outcome,
                "retry": delay is not None,
            },
        )
    if not ok:
        log.warning("alert %s (%d items) not taken: %s", kind, len(items), outcome)
    return len(items) if ok else 0


def alert_acknowledge(
    *, actor: Principal, delivery_id: int | None = None, session_id: Any = None
) -> Acknowledgement:
    """An operator acknowledges a hold or a dead session: alerts not yet posted about it are
    dropped, and no new ones are made (for a session: about the silence it is in now). Audited."""
    actor.require_operator()
    if delivery_id is not None:
        if not Delivery.objects.filter(pk=delivery_id).exists():
            raise NotFound(f"No hold {delivery_id}.")
        target, pending = f"hold:{delivery_id}", Q(delivery_id=delivery_id)
    else:
        if not AgentSession.objects.filter(pk=session_id).exists():
            raise NotFound(f"No session {session_id}.")
        target, pending = f"session:{session_id}", Q(session_id=session_id)
    with transaction.atomic():
        ack = Acknowledgement.objects.create(delivery_id=delivery_id, session_id=session_id, by=actor.actor)
        dropped = Alert.objects.filter(pending, state=AlertState.PENDING).update(
            state=AlertState.SKIPPED, claim=None
        )
        audit_event(
            "alert.acknowledged",
            actor=actor.actor,
            target=target,
            delivery_id=delivery_id,
            detail={"alerts_dropped": dropped},
        )
    return ack


def acknowledgements_of(*, delivery_id: int | None = None, session_id: Any = None) -> list[Acknowledgement]:
    """Who acknowledged this hold or session, newest first."""
    q = Q(delivery_id=delivery_id) if delivery_id is not None else Q(session_id=session_id)
    return list(Acknowledgement.objects.filter(q).order_by("-at")[:20])
