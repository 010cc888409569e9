"""The pages an alert links to: one hold, or one session gone silent, with what an operator needs
to judge it and an "Acknowledge" button. The link carries no secret: the console login is what
lets a person in, and acknowledging is a CSRF-checked POST (alerts.services.alert_acknowledge)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from alerts.services import acknowledgements_of, alert_acknowledge
from console.views import console_page, operator_required, page_render
from messaging.errors import NotFound
from messaging.hold_reasons import hold_reason_label
from messaging.liveness import session_liveness
from messaging.models import AgentSession, Delivery
from messaging.principals import operator_principal
from messaging.sensitivity import match_labels


def _when(at: datetime | None) -> dict[str, Any] | str:
    """A time for the facts list, in UTC. A past one turns relative once the console's script
    runs ("3m ago"); a future one says how far off it is (the script only counts backwards)."""
    if at is None:
        return "—"
    text = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    left = int((at - timezone.now()).total_seconds())
    if left <= 0:
        return {"iso": at.isoformat(), "text": text, "past": True}
    return {"iso": at.isoformat(), "text": f"{text} (in {left // 60} min {left % 60} s)", "past": False}


@console_page
def hold_alert(request: HttpRequest, delivery_id: int) -> HttpResponse:
    d = Delivery.objects.select_related("message__sender", "recipient").filter(pk=delivery_id).first()
    if d is None:
        raise Http404("No such hold.")
    sender = d.message.sender
    return page_render(
        request,
        "console/alert.html",
        {
            "subject": "hold",
            "heading": f"Hold {d.pk}",
            "facts": [
                ("From", sender.label if sender else "the hub"),
                ("To", d.recipient.label),
                ("State", d.state + (" (escalated)" if d.escalate == "required" else "")),
                ("Held because", hold_reason_label(d.hold_reason, match_labels(d.message.matched))),
                ("Expires", _when(d.expires_at)),
            ],
            "links": [
                ("Decide it in the holds queue", f"{reverse('console:holds')}?recipient={d.recipient_id}"),
                ("The message", reverse("console:message", args=[d.message_id])),
            ],
            "acknowledgements": acknowledgements_of(delivery_id=d.pk),
            "acknowledge_url": reverse("console:alert-hold-acknowledge", args=[d.pk]),
        },
    )


@console_page
def session_alert(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = AgentSession.objects.filter(pk=session_id).first()
    if session is None:
        raise Http404("No such session.")
    return page_render(
        request,
        "console/alert.html",
        {
            "subject": "session",
            "heading": session.label,
            "facts": [
                ("Kind", session.kind),
                ("Status", session_liveness(session)),
                ("Last heard from", _when(session.last_seen)),
            ],
            "links": [("The session", reverse("console:session", args=[session.id]))],
            "acknowledgements": acknowledgements_of(session_id=session.id),
            "acknowledge_url": reverse("console:alert-session-acknowledge", args=[session.id]),
        },
    )


@require_POST
@operator_required
def hold_alert_acknowledge(request: HttpRequest, delivery_id: int) -> HttpResponse:
    try:
        alert_acknowledge(actor=operator_principal(request.user.get_username()), delivery_id=delivery_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    messages.success(request, f"Hold {delivery_id} acknowledged: no more alerts about it.")
    return HttpResponseRedirect(reverse("console:alert-hold", args=[delivery_id]))


@require_POST
@operator_required
def session_alert_acknowledge(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = AgentSession.objects.filter(pk=session_id).first()
    if session is None:
        raise Http404("No such session.")
    alert_acknowledge(actor=operator_principal(request.user.get_username()), session_id=session.id)
    messages.success(request, f"{session.label} acknowledged: no more alerts about this silence.")
    return HttpResponseRedirect(reverse("console:alert-session", args=[session.id]))


urlpatterns = [
    path("alerts/holds/<int:delivery_id>/", hold_alert, name="alert-hold"),
    path("alerts/holds/<int:delivery_id>/acknowledge", hold_alert_acknowledge, name="alert-hold-acknowledge"),
    path("alerts/sessions/<uuid:session_id>/", session_alert, name="alert-session"),
    path(
        "alerts/sessions/<uuid:session_id>/acknowledge",
        session_alert_acknowledge,
        name="alert-session-acknowledge",
    ),
]
