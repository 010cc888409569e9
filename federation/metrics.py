"""Federation's figures for the hub's metrics, read from the database at each scrape."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def forward_figures(now: datetime) -> Iterable[Metric]:
    """Deliveries handed to other hubs by tier and where they stand, and the tries they took."""
    from django.db.models import Count, Sum

    from federation.models import RemoteDelivery

    forwards = GaugeMetricFamily(
        "switchboard_forwards",
        "Deliveries handed to other hubs, by tier and their state there (pending, retry, at_relay, "
        "queued, delivered, read, failed, ...).",
        labels=["tier", "state"],
    )
    tries = CounterMetricFamily(
        "switchboard_forward_attempts", "Tries to hand deliveries to other hubs, by tier.", labels=["tier"]
    )
    by_tier: dict[str, int] = {}
    for row in (
        RemoteDelivery.objects.values("tier", "remote_state")
        .annotate(n=Count("id"), a=Sum("attempts"))
        .order_by()
    ):
        forwards.add_metric([row["tier"], row["remote_state"] or "pending"], row["n"])
        by_tier[row["tier"]] = by_tier.get(row["tier"], 0) + (row["a"] or 0)
    for tier, total in sorted(by_tier.items()):
        tries.add_metric([tier], total)
    yield forwards
    yield tries
