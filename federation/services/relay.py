"""The relay tier, both sides.

Relay role (`switchboard serve --role relay`): store sealed messages for hubs that pull them.
A hub takes a lease on an agent name before it pulls that agent's messages; while it holds the
lease (renewed on every pull cycle) other hubs' leases and pulls are refused (409). Each lease
carries the leasing hub's signed statement for the name and this relay (`lease_statement_sign`),
which the relay checks, keeps, and shows with the lease: a sender believes where the relay says
a name is only as far as that statement goes. A lease asked for without one is refused. Claims are
conditional updates, so two pulling hubs never both get one message; a claim that runs out goes
back for another try, and one that is released (local delivery failed) too, after a wait as long as
the message is old (`RELEASED_WAIT`), so messages a hub keeps releasing never head the queue of
newer ones. Messages expire (default 24 h).
The relay keeps routing metadata only: the payload is a sealed box to the destination hub.
Bounds, because any key may call a relay that takes first-use keys: what one storing key keeps
waiting (count and bytes), a receipt batch's size, and the bytes of one pull answer.

Hub side: `relay_pull_once` renews leases for this hub's live agents (each with a statement this
hub signed, `relay_lease_statements`), claims and opens what waits for them, hands each to
`inbound_accept`, and acknowledges (done) or releases it. `relay_lease_entry_problem` is what a
sender checks of the relay's word on a name before it routes there (or lists it).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone
from nacl.exceptions import CryptoError

from federation.errors import (
    LeaseHeld,
    LeaseStatementRefused,
    NotRelay,
    PermanentError,
    RelayQuotaFull,
    TransientError,
)
from federation.models import FederationTier, RelayLease, RelayMessage, RelayStorer
from federation.services.identity import hub_identity
from federation.services.keys import relay_key
from federation.services.signatures import (
    lease_statement_kept,
    lease_statement_longest,
    lease_statement_problem,
    lease_statement_sign,
)
from federation.transport import RefusedBody, hub_call, hub_json
from messaging.errors import Invalid, NotFound, SwitchboardError, TooLarge
from messaging.liveness import LIVE
from messaging.names import normalize_name
from messaging.services.audit import audit_event

log = logging.getLogger(__name__)
MAX_SEALED_BYTES = 80 * 1024 * 1024  # 50 MB of files, base64, plus the text
RECEIPTS_PER_PULL = 20
MESSAGES_PER_PULL = 50
# Names one pull leases or renews; and the live leases one key may hold, twice that: a hub's pull
# keeps its agents' names, with room for the ones it no longer renews while they lapse, and a key
# made at home cannot take every name nobody holds yet.
LEASES_PER_PULL = 500
LEASES_PER_HUB = 2 * LEASES_PER_PULL
# Hub side: pulls in one cycle while the relay says more waits, and how long a cycle keeps going
# back (the embedded scheduler runs the other periodic jobs on the same thread).
PULL_ROUNDS_PER_CYCLE = 8
PULL_CYCLE_SECONDS = 5.0
# A released message is offered again after a wait as long as its age, within these bounds: what
# a hub releases every time comes back ever more rarely, and never ahead of newer messages.
RELEASED_WAIT = (timedelta(seconds=5), timedelta(minutes=15))
_warned_leases: set[str] = set()  # names whose refused lease was already reported (per process)
# Hub side: the lease statements this hub signed, by (relay key, name as sent): each is sent again
# on every pull while at least a lease period of it is left, then signed afresh.
_lease_statements: dict[tuple[str, str], dict[str, Any]] = {}


def require_relay() -> None:
    if settings.SWITCHBOARD_ROLE != "relay":
        raise NotRelay("This hub does not run in relay role (`switchboard serve --role relay`).")


# --- relay role -----------------------------------------------------------------------------------


def relay_lease_take(*, hub_key: str, agent: str, statement: Any, now: Any = None) -> RelayLease:
    """Give `hub_key` the lease on `agent` (or renew it), kept with `statement`, the leasing hub's
    signed word that it leases the name here (LeaseStatementRefused when it is missing or does not
    hold for this key, name and relay, now). The lease ends when the statement does, if sooner
    than the lease period. LeaseHeld when another hub holds the lease."""
    require_relay()
    key = normalize_name(agent)
    if not key or len(key) > 256:
        raise Invalid("bad_agent", "Name the agent the lease is for.")
    now = now or timezone.now()
    problem = lease_statement_problem(
        statement, hub_key=hub_key, agent=key, relay_key=hub_identity().public_key, now=now.timestamp()
    )
    if problem is not None:
        raise LeaseStatementRefused(
            f"The lease on {agent!r} is taken only with the leasing hub's signed statement for it and "
            f"this relay; this request has {problem}.",
        )
    statement = lease_statement_kept(statement)
    # Compared as timestamps first: the key chose its statement's end, which may be past any date.
    until = datetime.fromtimestamp(
        min(now.timestamp() + settings.SWITCHBOARD_RELAY_LEASE_SECONDS, statement["valid_until"]), tz=UTC
    )
    with transaction.atomic():
        if not RelayLease.objects.filter(agent_key=key, hub_key=hub_key, expires_at__gt=now).exists():
            _leases_checked(hub_key, now=now)
        before = RelayLease.objects.filter(agent_key=key).values_list("hub_key", flat=True).first()
        taken = (
            RelayLease.objects.filter(agent_key=key)
            .filter(Q(hub_key=hub_key) | Q(expires_at__lte=now))
            .update(hub_key=hub_key, expires_at=until, agent_name=agent[:64], statement=dict(statement))
        )
        if taken:
            if before is not None and before != hub_key:
                # A lapsed lease went to another hub key: senders that pinned the old one keep
                # failing rather than sealing to the new one; the relay's operators see why.
                audit_event(
                    "relay.lease_moved",
                    actor="hub",
                    target=hub_key,
                    detail={"agent": key, "from_hub": before},
                )
            return RelayLease.objects.get(agent_key=key)
        try:
            with transaction.atomic():
                lease = RelayLease.objects.create(
                    agent_key=key,
                    agent_name=agent[:64],
                    hub_key=hub_key,
                    expires_at=until,
                    statement=dict(statement),
                )
        except IntegrityError:
            raise LeaseHeld(
                f"Another hub holds the lease on {agent!r}; it is live there. Stop this copy or wait for "
                "the lease to lapse.",
            ) from None
        audit_event("relay.lease_taken", actor="hub", target=hub_key, detail={"agent": key})
        return lease


def _leases_checked(hub_key: str, *, now: Any) -> None:
    """Before `hub_key` takes one more name: refuse (RelayQuotaFull, 429) when it holds
    LEASES_PER_HUB live leases already. Counted under the key's lock (`_storer_locked`), so a
    key's leases taken at once cannot pass the bound together."""
    _storer_locked(hub_key)
    if RelayLease.objects.filter(hub_key=hub_key, expires_at__gt=now).count() >= LEASES_PER_HUB:
        raise RelayQuotaFull(
            f"This hub key already holds {LEASES_PER_HUB} leases at the relay, as many as one key may; "
            "release the names it no longer hosts, or wait until the leases it no longer renews lapse.",
            limit=LEASES_PER_HUB,
        )


def relay_lease_release(*, hub_key: str, agent: str) -> bool:
    require_relay()
    deleted, _ = RelayLease.objects.filter(agent_key=normalize_name(agent), hub_key=hub_key).delete()
    return bool(deleted)


def _leases_shown(now: Any) -> QuerySet[RelayLease]:
    """Live leases that carry their hub's statement: the only ones a sender is told of."""
    return RelayLease.objects.filter(expires_at__gt=now, statement__isnull=False)


def relay_lookup(*, target: str, now: Any = None) -> dict[str, Any]:
    """Which hub (if any) holds a live lease on `target`, with that hub's signed statement for
    it: what a sender checks (`relay_lease_entry_problem`) and then seals to."""
    require_relay()
    now = now or timezone.now()
    lease = _leases_shown(now).filter(agent_key=normalize_name(target)).first()
    if lease is None:
        return {"hosted": False}
    return {"hosted": True, "hub_key": lease.hub_key, "name": lease.agent_name, "statement": lease.statement}


def relay_agents(*, now: Any = None) -> list[dict[str, Any]]:
    """The leased names (at most 1000), each with its hub key and that hub's statement."""
    require_relay()
    now = now or timezone.now()
    return [
        {"name": lease.agent_name, "hub_key": lease.hub_key, "statement": lease.statement}
        for lease in _leases_shown(now).order_by("agent_key")[:1000]
    ]


def relay_store(
    *,
    from_hub: str,
    kind: str,
    message_id: str,
    dest_hub: str,
    agent: str,
    sealed: str,
    replace: bool = False,
) -> tuple[RelayMessage, bool]:
    """Keep a sealed message (or receipt batch) for `dest_hub`. A row is keyed by its storing hub
    too (`from_hub`, the key that signed the request): the same key storing the same id twice is a
    no-op (returns created=False), except that a receipt batch replaces that key's earlier one.
    Another key storing under the same id gets a row of its own and never touches this one, so an
    id read off a frame lets nobody overwrite, wipe or squat another hub's message or receipts.
    What one key keeps waiting is bounded (`_pending_check`, RelayQuotaFull): the check and the
    write run under that key's lock, one store of the key at a time."""
    require_relay()
    if kind not in ("message", "receipt"):
        raise Invalid("bad_kind", "kind is `message` or `receipt`.")
    try:
        mid = uuid.UUID(str(message_id))
        blob = base64.b64decode(sealed, validate=True)
    except ValueError as exc:
        raise Invalid("bad_relay_message", "message_id is a UUID and sealed is base64.") from exc
    # A receipt batch needs no lease and can name any destination key, so it has a cap of its own,
    # sized for the largest batch a hub makes (`receipts.RECEIPTS_PER_BATCH`), not for files.
    limit = MAX_SEALED_BYTES if kind == "message" else settings.SWITCHBOARD_RELAY_RECEIPT_MAX_BYTES
    if len(blob) > limit:
        raise TooLarge(
            f"The sealed {'message' if kind == 'message' else 'receipt batch'} is larger than this relay "
            f"keeps ({limit} bytes).",
            size=len(blob),
            limit=limit,
        )
    if kind == "message" and not relay_lookup(target=agent)["hosted"]:
        raise NotFound(
            f"No hub has registered {agent!r} with this relay; nothing is queued for a name nobody hosts."
        )
    now = timezone.now()
    fields = {
        "agent_key": normalize_name(agent) if kind == "message" else "",
        "from_hub": from_hub,
        "sealed": blob,
        "size": len(blob),
        "expires_at": now + timedelta(seconds=settings.SWITCHBOARD_RELAY_EXPIRY_SECONDS),
    }
    with transaction.atomic():
        _storer_locked(from_hub)
        row = RelayMessage.objects.filter(
            kind=kind, message_id=mid, dest_hub=dest_hub, from_hub=from_hub
        ).first()
        if row is None:
            _pending_check(from_hub=from_hub, size=len(blob), now=now)
            return RelayMessage.objects.create(kind=kind, message_id=mid, dest_hub=dest_hub, **fields), True
        if replace and kind == "receipt":
            _pending_check(from_hub=from_hub, size=len(blob), now=now, replacing=row.pk)
            RelayMessage.objects.filter(pk=row.pk).update(
                done=False, claimed_by="", claimed_until=None, **fields
            )
        return row, False


def _storer_locked(hub_key: str) -> None:
    """Lock `hub_key`'s storer row (made on its first store) until the transaction ends: a
    concurrent store of the same key waits here, so it counts what this one writes. SQLite has no
    row locks; its IMMEDIATE transaction already runs one writer at a time."""
    RelayStorer.objects.select_for_update().get_or_create(hub_key=hub_key)


def _pending_check(*, from_hub: str, size: int, now: Any, replacing: Any = None) -> None:
    """Refuse (RelayQuotaFull, 429) a new item from `from_hub` when the key already keeps as many
    items, or with `size` more bytes than, one key may keep waiting here (`replacing`: the row the
    new item takes the place of, not counted). Pending is what is not done and not expired, claimed
    or not. Run under the key's lock (`_storer_locked`), with the write that follows it."""
    pending = (
        RelayMessage.objects.filter(from_hub=from_hub, done=False, expires_at__gt=now)
        .exclude(pk=replacing)
        .aggregate(count=Count("id"), size=Sum("size"))
    )
    count, kept = pending["count"], pending["size"] or 0
    if count >= settings.SWITCHBOARD_RELAY_PENDING_PER_HUB:
        raise RelayQuotaFull(
            f"This hub key already keeps {count} items waiting at the relay, as many as one key may; "
            "try again once its destinations have pulled them.",
            pending=count,
            limit=settings.SWITCHBOARD_RELAY_PENDING_PER_HUB,
        )
    if kept + size > settings.SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB:
        raise RelayQuotaFull(
            f"This hub key already keeps {kept} bytes waiting at the relay; with {size} more it would "
            "pass what one key may keep. Try again once its destinations have pulled them.",
            pending_bytes=kept,
            limit_bytes=settings.SWITCHBOARD_RELAY_PENDING_BYTES_PER_HUB,
        )


@dataclass
class PullBudget:
    """The sealed bytes one pull answer may still carry. An item goes when it fits in what is
    left, or when it is the first of its kind in the answer: so a message larger than the whole
    budget still goes (alone), and neither messages nor receipts can keep the other waiting. One
    answer is therefore at most max(budget, the largest message) plus one receipt batch."""

    left: int

    def take(self, size: int, *, first: bool) -> bool:
        if first or size <= self.left:
            self.left -= size
            return True
        return False

    def give_back(self, size: int) -> None:
        self.left += size


def _takeable(now: Any) -> Q:
    """Rows no pull is kept from at `now`: never claimed, or their claim (or a release's wait) over."""
    return Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)


def _waiting(*, kind: str, hub_key: str, now: Any) -> QuerySet[RelayMessage]:
    """Items of `kind` for `hub_key` that a pull may take now, oldest first."""
    return (
        RelayMessage.objects.filter(kind=kind, dest_hub=hub_key, done=False, expires_at__gt=now)
        .filter(_takeable(now))
        .order_by("created_at", "id")
    )


def _claim_in_order(
    qs: QuerySet[RelayMessage], *, hub_key: str, limit: int, budget: PullBudget, now: Any
) -> tuple[list[dict[str, Any]], bool]:
    """Claim rows of `qs` in its order, up to `limit` and while `budget` takes them; stop at the
    first that does not fit (no overtaking: the rest waits for the next pull, in order). Returns
    the claimed items and whether more waits. Each claim is a conditional update, so no item goes
    to two callers at once; a row lost to another caller costs no budget."""
    until = now + timedelta(seconds=settings.SWITCHBOARD_RELAY_CLAIM_SECONDS)
    claimed: list[dict[str, Any]] = []
    for row_id, size in list(qs.values_list("id", "size")[: limit + 1]):
        if len(claimed) >= limit or not budget.take(size, first=not claimed):
            return claimed, True
        with transaction.atomic():
            won = (
                RelayMessage.objects.filter(pk=row_id, done=False)
                .filter(_takeable(now))
                .update(claimed_by=hub_key, claimed_until=until)
            )
        if not won:
            budget.give_back(size)
            continue
        row = RelayMessage.objects.get(pk=row_id)
        claimed.append(
            {
                "id": str(row.id),
                "message_id": str(row.message_id),
                "from_hub": row.from_hub,
                "sealed": base64.b64encode(bytes(row.sealed)).decode("ascii"),
            }
        )
    return claimed, False


def relay_claim(
    *, hub_key: str, agent: str = "", kind: str = "message", limit: int = 20, now: Any = None
) -> list[dict[str, Any]]:
    """Claim up to `limit` waiting items for `hub_key`, oldest first, within one answer's byte
    budget (`PullBudget`, SWITCHBOARD_RELAY_PULL_MAX_BYTES). Messages need the agent's lease
    (LeaseHeld otherwise)."""
    require_relay()
    now = now or timezone.now()
    qs = _waiting(kind=kind, hub_key=hub_key, now=now)
    if kind == "message":
        key = normalize_name(agent)
        lease = RelayLease.objects.filter(agent_key=key).first()
        if lease is None or lease.hub_key != hub_key or lease.expires_at <= now:
            raise LeaseHeld(
                f"Take the lease on {agent!r} before pulling its messages; another hub may hold it."
            )
        qs = qs.filter(agent_key=key)
    budget = PullBudget(settings.SWITCHBOARD_RELAY_PULL_MAX_BYTES)
    claimed, _ = _claim_in_order(qs, hub_key=hub_key, limit=max(1, min(limit, 100)), budget=budget, now=now)
    return claimed


def relay_claim_finish(*, hub_key: str, claim_id: str, outcome: str, now: Any = None) -> bool:
    """`done`: delivered, forget the ciphertext. `release`: local delivery failed, let it go back
    once it has waited as long as it is old (`RELEASED_WAIT`)."""
    require_relay()
    if outcome not in ("done", "release"):
        raise Invalid("bad_outcome", "outcome is `done` or `release`.")
    qs = RelayMessage.objects.filter(pk=claim_id, claimed_by=hub_key, done=False)
    if outcome == "done":
        return bool(qs.update(done=True, sealed=b"", claimed_until=None))
    now = now or timezone.now()
    created_at = qs.values_list("created_at", flat=True).first()
    if created_at is None:
        return False
    shortest, longest = RELEASED_WAIT
    wait = min(max(now - created_at, shortest), longest)
    return bool(qs.update(claimed_by="", claimed_until=now + wait))


def relay_pull(
    *,
    hub_key: str,
    agents: list[str],
    statements: Mapping[str, Any] | None = None,
    limit: int = MESSAGES_PER_PULL,
) -> dict[str, Any]:
    """One pull cycle for a hub in one call: take or renew the lease on each of its live agents
    (each with its statement in `statements`, by the name as listed), claim their messages (only
    where the lease is this hub's; oldest first across them), and claim its receipts, all within
    one answer's byte budget (`PullBudget`). `leases` says per name `ok`, `held_elsewhere`,
    `bad_statement` (no statement, or one that does not hold: no lease taken) or `quota_full`
    (the key holds LEASES_PER_HUB leases already). `more` says that
    items were left for the next pull (budget or count reached), so the hub pulls again."""
    require_relay()
    now = timezone.now()
    statements = statements if isinstance(statements, Mapping) else {}
    leases: dict[str, str] = {}
    leased: list[str] = []
    for name in list(dict.fromkeys(a for a in agents if isinstance(a, str) and a))[:LEASES_PER_PULL]:
        try:
            relay_lease_take(hub_key=hub_key, agent=name, statement=statements.get(name), now=now)
        except LeaseHeld:
            leases[name] = "held_elsewhere"
            continue
        except LeaseStatementRefused:
            leases[name] = "bad_statement"
            continue
        except RelayQuotaFull:
            leases[name] = "quota_full"
            continue
        leases[name] = "ok"
        leased.append(normalize_name(name))
    budget = PullBudget(settings.SWITCHBOARD_RELAY_PULL_MAX_BYTES)
    messages: list[dict[str, Any]] = []
    more_messages = False
    if leased:
        waiting = _waiting(kind="message", hub_key=hub_key, now=now).filter(agent_key__in=leased)
        messages, more_messages = _claim_in_order(
            waiting, hub_key=hub_key, limit=limit, budget=budget, now=now
        )
    receipts, more_receipts = _claim_in_order(
        _waiting(kind="receipt", hub_key=hub_key, now=now),
        hub_key=hub_key,
        limit=RECEIPTS_PER_PULL,
        budget=budget,
        now=now,
    )
    return {
        "leases": leases,
        "messages": messages,
        "receipts": receipts,
        "more": more_messages or more_receipts,
    }


def relay_claims_finish(*, hub_key: str, done: list[str], release: list[str]) -> int:
    """Finish many claims at once (see `relay_claim_finish`). Returns how many changed."""
    changed = 0
    for outcome, ids in (("done", done), ("release", release)):
        for claim_id in ids[:500]:
            try:
                changed += relay_claim_finish(hub_key=hub_key, claim_id=str(claim_id), outcome=outcome)
            except (ValueError, Invalid):
                continue
    return changed


def relay_expire(*, now: Any = None) -> int:
    """Drop expired messages and delivered ones, lapsed leases, and the storer rows of keys that
    keep nothing here any more."""
    now = now or timezone.now()
    deleted, _ = RelayMessage.objects.filter(Q(expires_at__lte=now) | Q(done=True)).delete()
    RelayLease.objects.filter(expires_at__lte=now - timedelta(hours=1)).delete()
    RelayStorer.objects.exclude(hub_key__in=RelayMessage.objects.values("from_hub")).delete()
    return deleted


# --- hub side -------------------------------------------------------------------------------------


def relay_pull_once(*, sessions: list[dict[str, str]] | None = None) -> dict[str, int]:
    """One pull cycle against SWITCHBOARD_RELAY_URL: renew leases, take messages and receipts,
    deliver each message here, then tell the relay which are done and which go back (released).
    While the relay answers that more waits (it bounds each answer's bytes), pull again at once,
    at most PULL_ROUNDS_PER_CYCLE times and for about PULL_CYCLE_SECONDS; the next cycle goes on."""
    relay = settings.SWITCHBOARD_RELAY_URL
    counts = {"delivered": 0, "released": 0, "refused_leases": 0, "receipts": 0}
    if not relay or settings.SWITCHBOARD_ROLE == "relay":
        return counts
    if sessions is None:
        sessions = live_session_names()
    agents = sorted({s["name"] for s in sessions})
    started = time.monotonic()
    for _ in range(PULL_ROUNDS_PER_CYCLE):
        # What this round released waits at the relay (`RELEASED_WAIT`): the next round gets newer.
        more = _relay_pull_round(relay=relay, agents=agents, counts=counts)
        if not more or time.monotonic() - started >= PULL_CYCLE_SECONDS:
            break
    return counts


def _relay_pull_round(*, relay: str, agents: list[str], counts: dict[str, int]) -> bool:
    """One pull from the relay, its items handed over here and its claims finished; adds to
    `counts`. Returns whether the relay said more waits."""
    from federation.services.forwarding import inbound_accept, unseal
    from federation.services.receipts import receipts_open_relayed

    try:
        dest = relay_key()
        body = {"agents": agents, "statements": relay_lease_statements(agents, relay_key=dest)}
        answer = hub_call("POST", relay, "/relay/pull", body, dest_key=dest) or {}
    except (TransientError, PermanentError) as exc:
        log.info("relay pull failed: %s", exc)
        return False
    messages, receipts, leases = _pull_answer_items(answer)
    # Only the names this hub asked for: the relay's answer is its own word, any size it likes.
    refused = [name for name in agents if name in leases and leases[name] != "ok"]
    counts["refused_leases"] = len(refused)
    for name in set(refused) - _warned_leases:
        state = str(leases[name])[:40]
        if state == "bad_statement":
            # The relay did not take this hub's signed statement (its clock, or its key, is not
            # what this hub holds): senders would not believe the lease, so nothing comes here.
            log.warning("relay: the relay refused this hub's lease statement for %r; no relay messages", name)
        elif state == "quota_full":
            log.warning("relay: this hub holds as many leases as the relay gives one key; %r has none", name)
        else:
            # Another hub holds this name's lease: its relay messages go there, not to this copy.
            log.warning(
                "relay: another hub holds the lease on %r; this hub's copy gets no relay messages", name
            )
        audit_event("relay.lease_refused", actor="hub", target=name, detail={"relay": relay, "state": state})
    _warned_leases.clear()
    _warned_leases.update(refused)
    done: list[str] = []
    release: list[str] = []
    for item in messages:
        try:
            envelope = hub_json(unseal(base64.b64decode(item["sealed"])))
            # No carrying hub to vouch for: the origin's signature must name this hub's key.
            inbound_accept(envelope=envelope, tier=FederationTier.RELAY, caller_key=None)
            done.append(item["id"])
        except RefusedBody as exc:
            log.info("relay message %s refused here: %s", item.get("message_id"), exc)
            done.append(item["id"])  # the same bytes come back the same: drop it
        except SwitchboardError as exc:
            # 400/403 (bad envelope, hop limit, revoked sender): a retry can't help, drop it.
            log.info("relay message %s refused here: %s", item.get("message_id"), exc.detail)
            (done if exc.status in (400, 403) else release).append(item["id"])
        except Exception:
            log.exception("relay message %s failed to deliver; releasing it", item.get("message_id"))
            release.append(item["id"])
    for item in receipts:
        try:
            counts["receipts"] += receipts_open_relayed(payload=unseal(base64.b64decode(item["sealed"])))
        except (CryptoError, KeyError, TypeError, ValueError) as exc:
            # Anyone may store a batch for this hub's key: one that is not sealed to it is junk,
            # a line each without a trace (no audit row: nothing in it is anyone's word).
            log.info("relay receipt %s could not be opened: %s", item.get("id"), type(exc).__name__)
        except Exception:
            log.exception("relay receipt %s could not be opened", item.get("id"))
        done.append(item["id"])
    counts["delivered"] += len(done) - len(receipts)
    counts["released"] += len(release)
    if done or release:
        try:
            hub_call(
                "POST",
                relay,
                "/relay/claims/finish",
                {"done": done, "release": release},
                dest_key=relay_key(),
            )
        except (TransientError, PermanentError) as exc:
            log.info("relay: claims not finished (they lapse and come back): %s", exc)
            return False
    return bool(isinstance(answer, dict) and answer.get("more"))


def _pull_answer_items(
    answer: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The messages, receipt batches and lease states of a pull answer, as far as a relay gives
    them: at most MESSAGES_PER_PULL messages and RECEIPTS_PER_PULL batches, each an object with
    a string id (the rest is left: an item not finished lapses at the relay and comes back)."""
    if not isinstance(answer, dict):
        return [], [], {}

    def items(key: str, limit: int) -> list[dict[str, Any]]:
        given = answer.get(key)
        listed = given[:limit] if isinstance(given, list) else []
        return [i for i in listed if isinstance(i, dict) and isinstance(i.get("id"), str)]

    leases = answer.get("leases")
    return (
        items("messages", MESSAGES_PER_PULL),
        items("receipts", RECEIPTS_PER_PULL),
        leases if isinstance(leases, dict) else {},
    )


def relay_lease_statements(agents: list[str], *, relay_key: str, now: float | None = None) -> dict[str, Any]:
    """This hub's signed lease statement for each name in `agents`, for the relay holding
    `relay_key` (`lease_statement_sign`): the one signed before while at least a lease period of
    it is left (the relay's lease then runs its full period), else a fresh one. Statements for
    names no longer listed are forgotten."""
    clock = time.time() if now is None else now
    lease_seconds = settings.SWITCHBOARD_RELAY_LEASE_SECONDS
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for name in agents:
        statement = _lease_statements.get((relay_key, name))
        if statement is None or statement["valid_until"] - clock < lease_seconds:
            statement = lease_statement_sign(agent=name, relay_key=relay_key, now=clock)
        kept[(relay_key, name)] = statement
    _lease_statements.clear()
    _lease_statements.update(kept)
    return {name: kept[(relay_key, name)] for name in agents}


def relay_lease_entry_problem(entry: Any, *, asked: str, relay_key: str) -> str | None:
    """Why this hub does not believe the relay's word that `asked` is leased by the hub `entry`
    names (an answer to "who holds X?", or a row of the relay's list), or None when it does: the
    entry must name a hub key and the same name, and carry that key's own statement for the name
    and this relay (`relay_key`), fresh and no longer than a lease (`lease_statement_problem`).
    The relay alone cannot move a name to another hub: it can only show what that hub signed."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("hub_key"), str):
        return "an answer that names no hub key"
    if normalize_name(str(entry.get("name", asked))) != normalize_name(asked):
        return "an answer about another name"
    return lease_statement_problem(
        entry.get("statement"),
        hub_key=entry["hub_key"],
        agent=asked,
        relay_key=relay_key,
        longest=lease_statement_longest(),
    )


def relay_lease_drop(*, name: str) -> None:
    """Give up this hub's lease on `name` (its session left)."""
    relay = settings.SWITCHBOARD_RELAY_URL
    if not relay:
        return
    from urllib.parse import quote

    try:
        hub_call("DELETE", relay, f"/relay/leases/{quote(name)}", dest_key=relay_key())
    except (TransientError, PermanentError) as exc:
        log.info("relay lease on %r not released: %s", name, exc)


def live_session_names() -> list[dict[str, str]]:
    from messaging.models import AgentSession

    return [
        {"id": str(s.id), "name": s.name, "name_key": s.name_key, "ref": s.ref, "cwd": s.cwd}
        for s in AgentSession.objects.filter(status__in=LIVE).exclude(kind="remote")
    ]
