"""Agent sessions: register, authenticate, report status and heartbeat, deregister."""

from __future__ import annotations

import functools
import re
import secrets
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from messaging.credentials import SESSION_PREFIX, hash_token, new_token
from messaging.errors import Conflict, Forbidden, Invalid, Unauthorized
from messaging.liveness import LIVE, liveness_fields
from messaging.models import (
    AgentSession,
    Delivery,
    PermissionMode,
    SessionStatus,
    session_kind_problem,
)
from messaging.names import clean_name, name_problem, normalize_name
from messaging.plugins import PLUGINS, session_registered, session_status_changed
from messaging.principals import Principal
from messaging.services.audit import audit_event
from messaging.services.bulk import models_selected
from messaging.services.events import announce
from messaging.uds import UDS_PREFIX, PermanentSocketError, socket_path

REF_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: refs are read aloud and retyped
REF_LENGTH = 6
RESERVED_NAMES = frozenset({"lead", "hub", "operator", "switchboard"})
REPORTABLE_STATUSES = frozenset({SessionStatus.BUSY, SessionStatus.IDLE, SessionStatus.STOPPED})
# A session in one of these has no live connection: its open agent sockets are closed when it
# enters one (the `session.closed` event) and a new socket is refused while it stays there. An
# exited session's token is revoked for good; a user-stopped one comes back only by reporting busy
# or idle over HTTP.
CLOSED_STATUSES = frozenset({SessionStatus.EXITED, SessionStatus.USER_STOPPED})
SESSION_CLOSED_EVENT = "session.closed"
# What `SESSION_CLOSED_EVENT` carries as `status` when a retried registration replaced the token:
# the session stays open, but sockets opened with the old token close.
TOKEN_REISSUED = "token_reissued"
# A client's registration key: at least 22 URL-safe base64 characters (128 bits and more).
REGISTRATION_KEY = re.compile(r"^[A-Za-z0-9_-]{22,128}$")


@dataclass(frozen=True)
class Registration:
    session: AgentSession
    token: str  # shown once; only its hash is kept
    reissued: bool = False  # a retried registration: the session registered before, with a new token


def new_ref() -> str:
    """A fresh random ref; the unique index on `AgentSession.ref` decides whether it is free."""
    return "".join(secrets.choice(REF_ALPHABET) for _ in range(REF_LENGTH))


def session_register(
    *,
    name: str,
    cwd: str = "",
    kind: str = "script",
    permission_mode: str = PermissionMode.DEFAULT,
    peer_address: str = "",
    status: str = SessionStatus.IDLE,
    headless: bool = False,
    registration_key: str | None = None,
    from_this_machine: bool = True,
) -> Registration:
    """Register a session and return it with its token (the only time the token is seen).

    `registration_key` makes a registration safe to retry when its answer was lost: the session
    that registered with the same key, while it is open and has the same name, is handed back
    with a fresh token (its old one revoked) instead of a second session being made. An exited
    session gives its key up, and the registration makes a new session.

    `from_this_machine` says the caller runs on the hub's machine, as the connection shows it
    (`messaging.auth.request_from_this_machine`; an in-process caller does). Only such a caller
    names a `uds:` socket address: the path is on this machine, so a registrant elsewhere naming
    one can only mean a socket some local listener took for itself."""
    problem = name_problem(name)
    if problem:
        raise Invalid("bad_name", problem)
    name = clean_name(name)
    if normalize_name(name) in RESERVED_NAMES:
        raise Invalid("reserved_name", f"{name!r} is a reserved word in addresses; pick another name.")
    if permission_mode not in PermissionMode.values:
        raise Invalid("bad_permission_mode", "permission_mode is `default` or `bypass`.")
    if status not in REPORTABLE_STATUSES:
        raise Invalid("bad_status", "A new session starts `busy`, `idle` or `stopped`.")
    if len(cwd) > 1024 or len(peer_address) > 1024:
        raise Invalid("too_long", "cwd and peer_address take up to 1024 characters.")
    kind = kind or "script"
    kind_problem = session_kind_problem(kind)
    if kind_problem:
        raise Invalid("bad_kind", kind_problem)
    if peer_address and not peer_address.startswith((UDS_PREFIX, "http://", "https://")):
        raise Invalid("bad_peer_address", "peer_address starts with `uds:`, `http://` or `https://`.")
    if peer_address.startswith(UDS_PREFIX):
        try:
            socket_path(peer_address)
        except PermanentSocketError as exc:
            raise Invalid("bad_peer_address", str(exc)) from None
        if not from_this_machine:
            raise Forbidden(
                "A `uds:` socket address names a path on the hub's machine, so only a client on that "
                "machine registers one, connected directly (loopback, not through a proxy). Register "
                "without peer_address and pull the inbox, or hold a WebSocket open.",
                reason="socket_address_not_local",
            )
    if registration_key is not None and not REGISTRATION_KEY.match(registration_key):
        raise Invalid(
            "bad_registration_key",
            "registration_key takes 22 to 128 letters, digits, - or _ (128 random bits or more).",
        )
    key_hash = hash_token(registration_key) if registration_key else None
    if key_hash is not None and (again := session_reissue(key_hash=key_hash, name=name)) is not None:
        return again

    elsewhere = PLUGINS.other_hubs.live_elsewhere(name_key=normalize_name(name), cwd=cwd)
    if elsewhere is not None:
        raise Conflict(
            f"{name!r} (in {cwd or 'no folder'}) is already live in the hub {elsewhere} on this "
            "machine; an agent runs in one hub at a time. Stop it there, or register under another name.",
            hub=elsewhere,
        )
    token, token_hash = new_token(SESSION_PREFIX)
    now = timezone.now()
    for _ in range(8):
        try:
            with transaction.atomic():
                if key_hash is not None:
                    # Only an exited session can still hold the key here (session_reissue took an
                    # open one): it gives the key up to this registration.
                    AgentSession.objects.filter(
                        registration_key_hash=key_hash, status=SessionStatus.EXITED
                    ).update(registration_key_hash=None)
                session = AgentSession.objects.create(
                    name=name,
                    name_key=normalize_name(name),
                    ref=new_ref(),
                    cwd=cwd,
                    kind=kind,
                    permission_mode=permission_mode,
                    peer_address=peer_address,
                    status=status,
                    headless=headless,
                    token_hash=token_hash,
                    registration_key_hash=key_hash,
                    last_seen=now,
                    status_changed_at=now,
                )
                audit_event(
                    "session.registered",
                    actor=f"session:{session.label}",
                    target=str(session.id),
                    detail={"kind": session.kind, "permission_mode": permission_mode},
                )
                announce("session.changed", session_summary(session), sessions=[session.id])
                session_registered.send(sender=AgentSession, session=session)
            return Registration(session=session, token=token)
        except IntegrityError:
            # A ref collision (draw another), or the same key registered meanwhile (hand that back).
            if key_hash is not None and (again := session_reissue(key_hash=key_hash, name=name)):
                return again
            continue
    raise RuntimeError("could not allocate a unique session ref")


def session_reissue(*, key_hash: str, name: str) -> Registration | None:
    """The open session that registered with this registration key (by its hash), with a fresh
    token: the old token's hash is replaced, so it answers 401 from now on, and sockets opened
    with it close. None when no open session holds the key. A session of another name holding it
    is a conflict: the key belongs to a different registration."""
    with transaction.atomic():
        session = (
            AgentSession.objects.select_for_update()
            .filter(registration_key_hash=key_hash)
            .exclude(status=SessionStatus.EXITED)
            .first()
        )
        if session is None:
            return None
        if session.name != clean_name(name):
            raise Conflict(
                f"This registration_key registered the open session {session.label}, not {name!r}; "
                "retry with the name it was first sent with, or register with a new key.",
                reason="registration_key",
            )
        token, session.token_hash = new_token(SESSION_PREFIX)
        session.last_seen = timezone.now()
        session.save(update_fields=["token_hash", "last_seen"])
        audit_event(
            "session.token_reissued",
            actor=f"session:{session.label}",
            target=str(session.id),
            detail={"why": "registration retried with its registration_key"},
        )
        announce(
            SESSION_CLOSED_EVENT,
            {"id": str(session.id), "status": TOKEN_REISSUED},
            sessions=[session.id],
            operators=False,
        )
    return Registration(session=session, token=token, reissued=True)


@functools.cache
def _session_by_token_sql() -> str:
    """The token lookup as SQL, compiled by the ORM once: every authenticated call makes it, and
    compiling the queryset each time costs more than running it."""
    sql, _params = AgentSession.objects.filter(token_hash="")[:1].query.sql_with_params()
    return sql


def session_from_token(token: str) -> AgentSession | None:
    """The live session a token belongs to, or None. Exited sessions' tokens stop working."""
    if not token.startswith(SESSION_PREFIX):
        return None
    found = models_selected(AgentSession, _session_by_token_sql(), [hash_token(token)])
    if not found or found[0].status == SessionStatus.EXITED:
        return None
    return found[0]


def session_socket_problem(session_id: object, *, token_hash: str) -> str | None:
    """Why the session may not keep (or open) a live agent socket now with the token whose hash
    is `token_hash` (the one it authenticated with), or None when it may. Read from the database,
    so a socket that joined its group just as the session closed, or just as a retried
    registration replaced its token, learns of it."""
    row = AgentSession.objects.filter(pk=session_id).values_list("status", "token_hash").first()
    status, current = row if row is not None else (None, None)
    return token_problem(token_hash, status=status, token_hash=current) or closed_problem(status)


def token_problem(held_hash: str, *, status: str | None, token_hash: str | None) -> str | None:
    """Why the token whose hash is `held_hash`, which authenticated a caller a while ago, no
    longer does, given the session's row as read now (`status` and `token_hash`, None when the row
    is gone): the session exited, or a retried registration replaced the token. None while it
    still does. Plain values in, so a caller reads the row in a query it makes anyway."""
    if status is None or status == SessionStatus.EXITED:
        return closed_problem(SessionStatus.EXITED)
    if token_hash != held_hash:
        return closed_problem(TOKEN_REISSUED)
    return None


def closed_problem(status: str | None) -> str | None:
    """The sentence a closed session's socket is told, by status (None for an open session)."""
    if status is None or status == SessionStatus.EXITED:
        return "This session has exited and its token is revoked; register again."
    if status == SessionStatus.USER_STOPPED:
        return "An operator stopped this session; report busy or idle over HTTP to come back."
    if status == TOKEN_REISSUED:
        return "This session's token was replaced by a retried registration; use the new token."
    return None


def session_touch(session: AgentSession) -> None:
    """Record that the session was seen now, written at once: explicit heartbeats and agent
    sockets, whose callers read the time back. Other authenticated calls note it for a later
    write with the others seen meanwhile (`messaging.services.seen`)."""
    now = timezone.now()
    AgentSession.objects.filter(pk=session.pk).update(last_seen=now)
    session.last_seen = now


def session_set_status(
    *, session: AgentSession, status: str, actor: Principal, final_answer: str | None = None
) -> AgentSession:
    """Change a session's status. Coming back from `stopped` releases what was held for it."""
    from messaging.services.delivery import deliveries_release_for_recipient, deliveries_retire_for_exit

    allowed = REPORTABLE_STATUSES | {SessionStatus.EXITED}
    if actor.is_operator:
        allowed = allowed | {SessionStatus.USER_STOPPED}
    if status not in allowed:
        raise Invalid("bad_status", f"status is one of {', '.join(sorted(allowed))}.")
    with transaction.atomic():
        locked = AgentSession.objects.select_for_update().get(pk=session.pk)
        if locked.status == SessionStatus.EXITED:
            raise Unauthorized("This session has exited; register again.")
        previous = locked.status
        now = timezone.now()
        locked.status = status
        locked.last_seen = now
        if previous != status:
            locked.status_changed_at = now
        fields = ["status", "last_seen", "status_changed_at"]
        if final_answer is not None:
            locked.final_answer = final_answer
            fields.append("final_answer")
        locked.save(update_fields=fields)
        if previous != status:
            audit_event(
                "session.status",
                actor=actor.actor,
                target=str(locked.id),
                detail={"from": previous, "to": status},
            )
            announce("session.changed", session_summary(locked), sessions=[locked.id])
            if status in CLOSED_STATUSES:
                # Every web process with a socket of this session hears it and closes that socket.
                announce(
                    SESSION_CLOSED_EVENT,
                    {"id": str(locked.id), "status": status},
                    sessions=[locked.id],
                    operators=False,
                )
        if status in LIVE and previous in (
            SessionStatus.STOPPED,
            SessionStatus.USER_STOPPED,
        ):
            deliveries_release_for_recipient(recipient=locked, actor=actor)
        if status == SessionStatus.EXITED:
            deliveries_retire_for_exit(recipient=locked, actor=actor)
        # Same transaction: what listeners write (a team's idle notification with the final
        # answer) commits with the status.
        session_status_changed.send(
            sender=AgentSession, session=locked, previous=previous, final_answer=final_answer, actor=actor
        )
    session.__dict__.update({f: getattr(locked, f) for f in fields})
    return locked


def session_report_bypass(*, session: AgentSession, actor: Principal) -> AgentSession:
    """The session says its client now runs tools without asking (its permission mode changed
    since it registered, or whoever registered it could not tell): it is `bypass` from now on,
    so the policies for such a receiver apply to what peers send it next. One way only: by its
    own word a session never goes back to `default`, since a token that leaked to the agent's
    tools must not lift the holds a person relies on (ending it and registering afresh does)."""
    with transaction.atomic():
        locked = AgentSession.objects.select_for_update().get(pk=session.pk)
        if locked.status == SessionStatus.EXITED:
            raise Unauthorized("This session has exited; register again.")
        if locked.permission_mode == PermissionMode.BYPASS:
            return locked
        previous = locked.permission_mode
        locked.permission_mode = PermissionMode.BYPASS
        locked.last_seen = timezone.now()
        locked.save(update_fields=["permission_mode", "last_seen"])
        audit_event(
            "session.permission_mode",
            actor=actor.actor,
            target=str(locked.id),
            detail={"from": previous, "to": PermissionMode.BYPASS},
        )
        announce("session.changed", session_summary(locked), sessions=[locked.id])
    session.permission_mode = locked.permission_mode
    return locked


@dataclass(frozen=True)
class TurnEnd:
    """What ending a turn did: `messages` were waiting (now delivered) and the session stays as it
    was; or none were, and `session` went idle."""

    session: AgentSession
    messages: list[Delivery]

    @property
    def went_idle(self) -> bool:
        return not self.messages


def session_end_turn(
    *, session: AgentSession, actor: Principal, final_answer: str | None = None, limit: int = 100
) -> TurnEnd:
    """The agent is about to stop (Claude Code's Stop hook), in one transaction: messages waiting
    for it are pulled (marked delivered, up to `limit`) and returned so it keeps working on them,
    its status unchanged; when none wait it reports idle with `final_answer` through
    `session_set_status`, so the teams' idle notifications and subscriptions fire as usual."""
    from messaging.services.delivery import inbox_pull

    with transaction.atomic():
        waiting = inbox_pull(recipient=session, actor=actor, limit=limit)
        if waiting:
            return TurnEnd(session=session, messages=waiting)
        idle = session_set_status(
            session=session, status=SessionStatus.IDLE, actor=actor, final_answer=final_answer
        )
        return TurnEnd(session=idle, messages=[])


def session_start_turn(
    *, session: AgentSession, actor: Principal, limit: int = 100, include_unacked: bool = False
) -> list[Delivery]:
    """A turn starts (a prompt after an idle), in one transaction: the session reports busy through
    `session_set_status` (releasing what was held if it was stopped) and pulls its waiting messages,
    as `inbox_pull` does. Returns the pulled deliveries."""
    from messaging.services.delivery import inbox_pull

    with transaction.atomic():
        session_set_status(session=session, status=SessionStatus.BUSY, actor=actor)
        return inbox_pull(recipient=session, actor=actor, limit=limit, include_unacked=include_unacked)


def session_deregister(*, session: AgentSession, actor: Principal) -> AgentSession:
    """Mark the session exited: its token stops working, its sockets close and nothing more is
    queued for it. The session itself may, an operator may end any session (a leaked token), and
    so may the hub itself; another session's token may not."""
    if actor.kind != "hub" and not actor.is_self_or_operator(session):
        actor.require_operator()
    return session_set_status(session=session, status=SessionStatus.EXITED, actor=actor)


def session_summary(session: AgentSession) -> dict[str, object]:
    """The public description of a session, as the API and live events show it. `dead` is true
    for a busy/idle session silent past SWITCHBOARD_DEAD_AFTER_SECONDS; `liveness` is then `dead`."""
    return {
        "id": str(session.id),
        "name": session.name,
        "ref": session.ref,
        "cwd": session.cwd,
        "kind": session.kind,
        "status": session.status,
        "permission_mode": session.permission_mode,
        "inbound_policy": session.inbound_policy,
        "peer_address": session.peer_address,
        "addressable": session.status in LIVE,
        "last_seen": session.last_seen.isoformat() if session.last_seen else None,
        **liveness_fields(session),
    }
