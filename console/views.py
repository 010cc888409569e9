"""Pages of the operator console. Each view checks that the user is an operator, parses the
request, calls a selector or a service, and renders. Message text reaches templates only through
Django's autoescaping and the browser only through `textContent` (see static/console/console.js)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import user_passes_test
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console import selectors
from console.consumers import is_operator_user
from console.forms import (
    EndSessionForm,
    HoldDecisionForm,
    OperatorLoginForm,
    PeerPinForm,
    PeerRevokeForm,
    PolicyForm,
    SenderPolicyForm,
)
from console.shell_lines import first_steps, manage_command
from federation.models import Peer
from federation.services.identity import hub_identity
from federation.services.keys import keys_refused_recently
from federation.services.peers import peer_pin, peer_pin_seen, peer_restore, peer_revoke
from messaging.errors import NotFound, SwitchboardError
from messaging.hold_reasons import hold_reason_label
from messaging.models import AgentSession, Tier
from messaging.principals import Principal, operator_principal
from messaging.selectors import message_for_viewer, message_status
from messaging.sensitivity import mask_text, match_labels
from messaging.services.export import export_pair_scope
from messaging.services.holds import hold_expiry_seconds_of, holds_decide, message_reveal
from messaging.services.policies import policy_set, sender_policy_set
from messaging.services.sessions import session_deregister
from teams.services.export import team_export_scope

# No inline script or style anywhere in the console, so the page may forbid them outright.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)

operator_required = user_passes_test(is_operator_user, login_url=settings.LOGIN_URL)
View = Callable[..., HttpResponse]


def console_page(view: View) -> View:
    """A GET page for operators. The audit cursor is taken before the page reads anything, so the
    browser's catch-up from it can only repeat a change the page already shows, never miss one."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        request.console_cursor = selectors.audit_cursor()  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return require_GET(operator_required(wrapper))


def _operator(request: HttpRequest) -> Principal:
    return operator_principal(request.user.get_username())


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def page_render(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """Render a console page with what every page needs: the audit cursor and what needs a human.
    Every page view renders through it (console.alert_views too), so each shows the same chrome."""
    attention = selectors.attention()
    base = {
        "cursor": request.console_cursor,  # type: ignore[attr-defined]
        "held_count": attention["held"],
        "attention": attention,
    }
    response = render(request, template, {**base, **context})
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


def _error(request: HttpRequest, exc: SwitchboardError, back: str) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(exc.as_dict(), status=exc.status)
    messages.error(request, exc.detail)
    return HttpResponseRedirect(back)


def _form_error(request: HttpRequest, form: Any, back: str) -> HttpResponse:
    problems = "; ".join(str(e) for errors in form.errors.values() for e in errors)
    if _wants_json(request):
        return JsonResponse({"error": "invalid", "detail": problems}, status=400)
    messages.error(request, problems)
    return HttpResponseRedirect(back)


class LoginView(auth_views.LoginView):
    template_name = "console/login.html"
    authentication_form = OperatorLoginForm
    redirect_authenticated_user = False
    extra_context = {"create_operator": manage_command("operator_create NAME")}

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        response = super().render_to_response(context, **kwargs)
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        return response


def login_locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """The login page for a username that failed too often (django-axes calls it): 429, with how
    long the lockout lasts and how an operator lifts it; the password is not checked."""
    minutes = max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60))
    response = render(
        request,
        "console/login.html",
        {
            "form": OperatorLoginForm(request),
            "create_operator": manage_command("operator_create NAME"),
            "locked_out": (
                f"Too many failed logins for this account: it is locked for {minutes} minute(s). "
                f"Another operator can lift the lock with `{manage_command('operator_unlock NAME')}`."
            ),
        },
        status=429,
    )
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


login_view = LoginView.as_view()
logout_view = auth_views.LogoutView.as_view(next_page=settings.LOGIN_URL)


def _feed_filter(request: HttpRequest) -> dict[str, Any]:
    """The feed's filters from the query: state, tier, one session, one team (to or from any of
    its roster). Unknown values are ignored, never an error."""
    state = request.GET.get("state", "")
    tier = request.GET.get("tier", "")
    session = AgentSession.objects.filter(pk=_uuid_or_none(request.GET.get("session", ""))).first()
    team = selectors.team_rows_by_id(_uuid_or_none(request.GET.get("team", "")))
    return {
        "state": state if state in selectors.FEED_STATES else "",
        "tier": tier if tier in selectors.FEED_TIERS else "",
        "session": session,
        "team": team,
        "session_ids": (
            [str(session.id)] if session else selectors.team_session_ids(team["id"]) if team else None
        ),
    }


@console_page
def dashboard(request: HttpRequest) -> HttpResponse:
    show_exited = request.GET.get("exited") == "1"
    dead_only = request.GET.get("liveness") == "dead"
    feed = _feed_filter(request)
    sessions = selectors.session_rows(include_exited=show_exited, dead_only=dead_only)
    return page_render(
        request,
        "console/dashboard.html",
        {
            "sessions": sessions,
            "first_steps": []
            if sessions or dead_only
            else first_steps(request.build_absolute_uri("/"), settings.SWITCHBOARD_HOME),
            "show_exited": show_exited,
            "dead_only": dead_only,
            "teams": selectors.team_rows(),
            "feed": selectors.feed_rows(
                session_ids=feed["session_ids"], state=feed["state"], tier=feed["tier"]
            ),
            "filter": feed,
            "filtered": bool(feed["state"] or feed["tier"] or feed["session_ids"] is not None),
            "feed_states": selectors.FEED_STATES,
            "feed_tiers": selectors.FEED_TIERS,
            "all_sessions": selectors.session_choices(),
        },
    )


@console_page
def holds(request: HttpRequest) -> HttpResponse:
    recipient = AgentSession.objects.filter(pk=_uuid_or_none(request.GET.get("recipient", ""))).first()
    escalated_only = request.GET.get("escalated") == "1"
    sort = request.GET.get("sort", "urgency")
    groups = selectors.hold_queue(
        recipient_id=str(recipient.id) if recipient else None, escalated_only=escalated_only, sort=sort
    )
    return page_render(
        request,
        "console/holds.html",
        {
            "groups": groups,
            "hold_count": sum(g["count"] for g in groups),
            "recipient": recipient,
            "escalated_only": escalated_only,
            "sort": sort if sort in selectors.HOLD_SORTS else "urgency",
        },
    )


def _uuid_or_none(raw: str) -> UUID | None:
    try:
        return UUID(raw)
    except ValueError:
        return None


@require_POST
@operator_required
def holds_decide_view(request: HttpRequest) -> HttpResponse:
    """Approve or deny the posted holds (one or many). JSON for the page's script, else a redirect."""
    back = reverse("console:holds")
    form = HoldDecisionForm(request.POST)
    if not form.is_valid():
        return _form_error(request, form, back)
    try:
        moved = holds_decide(
            delivery_ids=form.delivery_ids,
            approve=form.approve,
            actor=_operator(request),
            reason=form.cleaned_data["reason"],
        )
    except SwitchboardError as exc:
        return _error(request, exc, back)
    moved_ids = sorted(m.delivery_id for m in moved)
    skipped = sorted(set(form.delivery_ids) - set(moved_ids))
    verb = "Approved" if form.approve else "Denied"
    if _wants_json(request):
        return JsonResponse(
            {"action": form.cleaned_data["action"], "moved": moved_ids, "skipped": skipped, "verb": verb}
        )
    if moved_ids:
        messages.success(request, f"{verb} {len(moved_ids)} held message(s).")
    if skipped:
        messages.warning(
            request, f"{len(skipped)} were already decided or expired; nothing changed for them."
        )
    return HttpResponseRedirect(back)


def _session_or_404(session_id: UUID) -> AgentSession:
    session = AgentSession.objects.filter(pk=session_id).first()
    if session is None:
        raise Http404("No such session.")
    return session


@console_page
def session_detail(request: HttpRequest, session_id: UUID) -> HttpResponse:
    detail = selectors.session_detail(session_id=session_id)
    if detail is None:
        raise Http404("No such session.")
    session = detail["session"]
    hold_expiry = hold_expiry_seconds_of(session)
    # The expiry field holds the session's own setting only: filled with the hub's default, saving
    # the floor would pin that default on the session.
    policy_form = PolicyForm(
        initial={"policy": session.operator_policy or "", "hold_expiry_seconds": session.hold_expiry_seconds}
    )
    policy_form.fields["hold_expiry_seconds"].widget.attrs["placeholder"] = (
        f"the hub's default, {settings.SWITCHBOARD_HOLD_EXPIRY_SECONDS}"
    )
    return page_render(
        request,
        "console/session.html",
        {
            **detail,
            "policy_form": policy_form,
            "sender_form": SenderPolicyForm(),
            "hold_expiry": hold_expiry,
            "hold_expiry_default": settings.SWITCHBOARD_HOLD_EXPIRY_SECONDS,
            "partners": selectors.conversation_partners(session_id=session.id),
        },
    )


def _session_action(
    request: HttpRequest, session_id: UUID, form_class: type, act: Callable[[AgentSession, Any], str]
) -> HttpResponse:
    session = _session_or_404(session_id)
    back = reverse("console:session", args=[session.id])
    form = form_class(request.POST)
    if not form.is_valid():
        return _form_error(request, form, back)
    try:
        done = act(session, form.cleaned_data)
    except SwitchboardError as exc:
        return _error(request, exc, back)
    messages.success(request, done)
    return HttpResponseRedirect(back)


@require_POST
@operator_required
def session_policy(request: HttpRequest, session_id: UUID) -> HttpResponse:
    def act(session: AgentSession, data: dict[str, Any]) -> str:
        policy_set(
            session=session,
            policy=data["policy"],
            actor=_operator(request),
            hold_expiry_seconds=data["hold_expiry_seconds"],
        )
        floor = data["policy"] or "none (the default by permission mode)"
        return f"Operator's floor for {session.label} is now {floor}."

    return _session_action(request, session_id, PolicyForm, act)


@require_POST
@operator_required
def session_end(request: HttpRequest, session_id: UUID) -> HttpResponse:
    def act(session: AgentSession, data: dict[str, Any]) -> str:
        session_deregister(session=session, actor=_operator(request))
        return f"{session.label} has ended: its token no longer works."

    return _session_action(request, session_id, EndSessionForm, act)


@require_POST
@operator_required
def session_sender_policy(request: HttpRequest, session_id: UUID) -> HttpResponse:
    def act(session: AgentSession, data: dict[str, Any]) -> str:
        sender = AgentSession.objects.filter(pk=data["sender"]).first()
        if sender is None:
            raise NotFound("No such sender session.")
        sender_policy_set(recipient=session, sender=sender, action=data["action"], actor=_operator(request))
        return f"Messages from {sender.label} to {session.label}: {data['action'] or 'general policy'}."

    return _session_action(request, session_id, SenderPolicyForm, act)


@console_page
def team_detail(request: HttpRequest, team_id: UUID) -> HttpResponse:
    detail = selectors.team_detail(team_id=team_id)
    if detail is None:
        raise Http404("No such team.")
    return page_render(request, "console/team.html", detail)


def _message_page(request: HttpRequest, message: Any, *, revealed: bool) -> HttpResponse:
    """The message page: a sensitive message's secrets masked in its text and summary, unless the
    operator revealed them (`message_reveal_view`, audited)."""
    status = message_status(message)
    for delivery in status["deliveries"]:
        delivery["why"] = hold_reason_label(delivery["hold_reason"]) if delivery["hold_reason"] else ""
    masked = message.tier == Tier.SENSITIVE and not revealed
    shown = {
        "text": mask_text(message.text) if masked else message.text,
        "summary": mask_text(message.summary) if masked else message.summary,
    }
    return page_render(
        request,
        "console/message.html",
        {
            "message": message,
            "status": status,
            "shown": shown,
            "sensitive": message.tier == Tier.SENSITIVE,
            "masked": masked and (shown["text"] != message.text or shown["summary"] != message.summary),
            "revealed": revealed,
            "matched": match_labels(message.matched),
        },
    )


@console_page
def message_detail(request: HttpRequest, message_id: UUID) -> HttpResponse:
    try:
        message = message_for_viewer(message_id=str(message_id), viewer=_operator(request))
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    return _message_page(request, message, revealed=False)


@require_POST
@operator_required
def message_reveal_view(request: HttpRequest, message_id: UUID) -> HttpResponse:
    """Show a message as sent, its secrets unmasked: a deliberate action, audited."""
    request.console_cursor = selectors.audit_cursor()  # type: ignore[attr-defined]
    try:
        message = message_reveal(message_id=message_id, actor=_operator(request))
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    response = _message_page(request, message, revealed=True)
    response["Cache-Control"] = "no-store"
    return response


@console_page
def conversation_pair(request: HttpRequest, a: UUID, b: UUID) -> HttpResponse:
    """What two sessions said to each other, both directions, threaded by reply."""
    first, second = _session_or_404(a), _session_or_404(b)
    try:
        scope = export_pair_scope(a=first, b=second)
    except SwitchboardError as exc:
        raise Http404(exc.detail) from exc
    export_url = reverse("console:session-export", args=[first.id]) + f"?with={second.id}"
    return page_render(
        request,
        "console/conversation.html",
        {
            **selectors.conversation(scope),
            "title": f"{first.label} and {second.label}",
            "pair": (first, second),
            "team": None,
            "export_url": export_url,
            "refresh_match": str(first.id),
        },
    )


@console_page
def team_conversation(request: HttpRequest, team_id: UUID) -> HttpResponse:
    """What a team's roster said among themselves, threaded by reply."""
    try:
        scope = team_export_scope(team_id=team_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    team = selectors.team_rows_by_id(team_id)
    return page_render(
        request,
        "console/conversation.html",
        {
            **selectors.conversation(scope),
            "title": f"team {team['name']}" if team else scope.label,
            "pair": None,
            "team": team,
            "export_url": reverse("console:team-export", args=[team_id]) + "?",
            "refresh_match": "",
        },
    )


@require_GET
@operator_required
def attention_view(request: HttpRequest) -> JsonResponse:
    """The attention strip's figures, for a page that keeps it current."""
    return JsonResponse(selectors.attention())


@console_page
def audit(request: HttpRequest) -> HttpResponse:
    def _int(name: str) -> int | None:
        raw = request.GET.get(name, "")
        return int(raw) if raw.isdigit() else None

    kind = request.GET.get("kind", "").strip()[:48]
    actor = request.GET.get("actor", "").strip()[:200]
    events = selectors.audit_page(before=_int("before"), kind=kind, actor=actor)
    return page_render(
        request,
        "console/audit.html",
        {
            "events": events,
            "kind": kind,
            "actor": actor,
            "older": events[-1].id if len(events) >= 100 else None,
        },
    )


@console_page
def peers(request: HttpRequest) -> HttpResponse:
    me = hub_identity()
    return page_render(
        request,
        "console/peers.html",
        {
            "peers": selectors.peer_rows(),
            "unverified_keys": keys_refused_recently(),
            "me": {"name": me.name, "public_key": me.public_key, "fingerprint": me.fingerprint},
            "pin_form": PeerPinForm(),
            "revoke_form": PeerRevokeForm(),
        },
    )


def _peer_action(request: HttpRequest, act: Callable[[], str]) -> HttpResponse:
    back = reverse("console:peers")
    try:
        done = act()
    except SwitchboardError as exc:
        return _error(request, exc, back)
    messages.success(request, done)
    return HttpResponseRedirect(back)


def _peer_or_404(peer_id: int) -> Peer:
    peer = Peer.objects.filter(pk=peer_id).first()
    if peer is None:
        raise Http404("No such peer hub.")
    return peer


def _peer_label(peer: Peer) -> str:
    return peer.name or peer.public_key[:12]


@require_POST
@operator_required
def peer_pin_new(request: HttpRequest) -> HttpResponse:
    """Pin a hub key typed in by an operator (how a hub with trust on first use off meets a peer)."""
    form = PeerPinForm(request.POST)
    if not form.is_valid():
        return _form_error(request, form, reverse("console:peers"))

    def act() -> str:
        peer = peer_pin(**form.cleaned_data, actor=_operator(request))
        return f"Pinned the key of {_peer_label(peer)}."

    return _peer_action(request, act)


@require_POST
@operator_required
def peer_pin_existing(request: HttpRequest, peer_id: int) -> HttpResponse:
    """Pin the key a peer was first seen with, keeping its name and tier (`peer_pin_seen`)."""
    peer = _peer_or_404(peer_id)

    def act() -> str:
        pinned = peer_pin_seen(peer_id=peer.pk, actor=_operator(request))
        return f"Pinned the key of {_peer_label(pinned)}."

    return _peer_action(request, act)


@require_POST
@operator_required
def peer_revoke_view(request: HttpRequest, peer_id: int) -> HttpResponse:
    form = PeerRevokeForm(request.POST)
    if not form.is_valid():
        return _form_error(request, form, reverse("console:peers"))

    def act() -> str:
        peer = peer_revoke(peer_id=peer_id, mode=form.cleaned_data["mode"], actor=_operator(request))
        then = "held for an operator" if peer.revocation_mode == "hold" else "refused"
        return f"Revoked {_peer_label(peer)}: its messages are now {then}."

    return _peer_action(request, act)


@require_POST
@operator_required
def peer_restore_view(request: HttpRequest, peer_id: int) -> HttpResponse:
    def act() -> str:
        peer = peer_restore(peer_id=peer_id, actor=_operator(request))
        return f"Restored {_peer_label(peer)}: its messages are accepted again."

    return _peer_action(request, act)


@require_GET
@operator_required
def updates(request: HttpRequest) -> JsonResponse:
    """Catch-up for a browser whose socket dropped: current rows for whatever changed after `after`."""
    raw = request.GET.get("after", "0")
    after = int(raw) if raw.isdigit() else 0
    payload = selectors.updates_since(after=after)
    if request.GET.get("sessions") == "all":
        # Heartbeats are not audited (nor announced), so a page refreshes every session's last
        # seen now and then; otherwise a long-open dashboard would call a heartbeating session dead.
        payload["sessions"] = selectors.session_rows()
    payload["attention"] = selectors.attention()
    payload["held_count"] = payload["attention"]["held"]
    return JsonResponse(payload)
