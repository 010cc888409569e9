"""What the hub counts for its operators, in Prometheus' terms: one home for every metric's name,
labels and help.

Two kinds:
- counted in a process as things happen (rate-limit refusals, socket writes, open WebSockets,
  background task run time): module-level prometheus_client objects that services, tasks and
  consumers update. With PROMETHEUS_MULTIPROC_DIR set, prometheus_client keeps them in files there
  and every process that shares the folder is added up at a scrape (prometheus_client's
  multiprocess mode).
- read from the database at each scrape, hub-wide whatever process answers (deliveries by kind and
  state, holds waiting and the oldest one's age, recent delivery latency): collectors, registered
  with `database_collector_add`; the apps above `messaging` add theirs in `AppConfig.ready`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY

RATE_LIMIT_REFUSALS = Counter(
    "switchboard_rate_limit_refusals", "Sends refused by a rate limit, by the limit's reason.", ["reason"]
)
SOCKET_WRITES = Counter(
    "switchboard_socket_writes",
    "Frames written to agents' local sockets, by outcome (delivered, retry, left_queued, skipped).",
    ["outcome"],
)
OPEN_WEBSOCKETS = Gauge(
    "switchboard_open_websockets",
    "WebSockets open now, by kind (agent, console).",
    ["kind"],
    multiprocess_mode="livesum",
)
TASK_SECONDS = Histogram(
    "switchboard_task_seconds",
    "Run time of background tasks, by task.",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

LATENCY_SAMPLE = 1000  # the most recent deliveries the latency quantiles are taken over
QUANTILES = (0.5, 0.9, 0.99)

DatabaseCollector = Callable[[datetime], Iterable[Metric]]
_database_collectors: list[DatabaseCollector] = []


def database_collector_add(collector: DatabaseCollector) -> None:
    """Have `collector(now)` yield metric families read from the database at each scrape."""
    if collector not in _database_collectors:
        _database_collectors.append(collector)


def metrics_exposition() -> tuple[bytes, str]:
    """This process's (or, in multiprocess mode, every sharing process's) counters, and the
    database's figures: the body of a scrape and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST

    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
        body = generate_latest(registry)
    else:
        body = generate_latest(REGISTRY)
    database = CollectorRegistry(auto_describe=False)
    database.register(_DatabaseFigures())
    return body + generate_latest(database), CONTENT_TYPE_LATEST


class _DatabaseFigures:
    """Every registered database collector, read at one moment."""

    def collect(self) -> Iterable[Metric]:
        from django.utils import timezone

        now = timezone.now()
        for collector in [messaging_figures, *_database_collectors]:
            yield from collector(now)


def messaging_figures(now: datetime) -> Iterable[Metric]:
    """Deliveries by message kind and state, holds waiting (by reason) and the oldest one's age,
    and quantiles of the time from send to delivered and to read over recent deliveries."""
    from django.db.models import Count, Min

    from messaging.models import Delivery
    from messaging.states import DeliveryState

    deliveries = GaugeMetricFamily(
        "switchboard_deliveries",
        "Deliveries in the database, by message kind and state.",
        labels=["kind", "state"],
    )
    for row in Delivery.objects.values("message__kind", "state").annotate(n=Count("id")).order_by():
        deliveries.add_metric([row["message__kind"], row["state"]], row["n"])
    yield deliveries

    held = Delivery.objects.filter(state=DeliveryState.HELD)
    holds = GaugeMetricFamily(
        "switchboard_holds_pending", "Held deliveries waiting for a decision, by reason.", labels=["reason"]
    )
    for row in held.values("hold_reason").annotate(n=Count("id")).order_by():
        holds.add_metric([row["hold_reason"] or "unspecified"], row["n"])
    yield holds
    oldest = held.aggregate(at=Min("held_at"))["at"]
    yield GaugeMetricFamily(
        "switchboard_hold_oldest_age_seconds",
        "How long the oldest held delivery has waited (0 when none is held).",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )

    latency = GaugeMetricFamily(
        "switchboard_delivery_latency_seconds",
        f"Time from send to delivered and to read, quantiles over the latest {LATENCY_SAMPLE} such deliveries.",
        labels=["to", "quantile"],
    )
    for to, field in (("delivered", "delivered_at"), ("read", "read_at")):
        spans = _recent_spans(field)
        for q in QUANTILES:
            if spans:
                latency.add_metric([to, str(q)], spans[min(len(spans) - 1, int(q * len(spans)))])
    yield latency


def _recent_spans(field: str) -> list[float]:
    """Seconds from created to `field`, sorted, for the latest deliveries that have it (newest ids
    first: the primary key's order, so the read stops after LATENCY_SAMPLE rows)."""
    from messaging.models import Delivery

    rows: Any = (
        Delivery.objects.filter(**{f"{field}__isnull": False})
        .order_by("-id")
        .values_list("created_at", field)[:LATENCY_SAMPLE]
    )
    return sorted(max(0.0, (done - created).total_seconds()) for created, done in rows)
