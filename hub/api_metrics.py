"""`GET /api/v1/metrics`: the hub's metrics in Prometheus' text format, for operators (an operator
token as a bearer credential, as Prometheus' `authorization` setting sends it, or a console login)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from ninja import Router

from messaging.auth import AUTH, operator
from messaging.metrics import metrics_exposition

router = Router(tags=["operations"])


@router.get("/metrics", auth=AUTH, include_in_schema=False)
def metrics(request: HttpRequest) -> HttpResponse:
    """Counters of this process (every process sharing PROMETHEUS_MULTIPROC_DIR) and the database's figures."""
    operator(request)
    body, content_type = metrics_exposition()
    return HttpResponse(body, content_type=content_type)
