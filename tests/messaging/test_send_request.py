"""A send's request and its origin (`messaging.services.request`): the rules read the origin."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from messaging.errors import NotFound, RateLimited
from messaging.services.pipeline import message_send, messages_send
from messaging.services.request import AGENT_ORIGIN, HUB_MADE, Origin, SendRequest
from messaging.services.sessions import session_register


@dataclass(frozen=True)
class Context:
    message_id: uuid.UUID
    tier: str = "lan"
    trust: str = "lan-verified"
    vouched: bool = True

    def adjust(self, decision: Any, *, recipient: Any, now: Any) -> Any:
        return decision


def test_an_origin_says_which_rules_a_send_follows() -> None:
    assert (AGENT_ORIGIN.trust, AGENT_ORIGIN.hub_made) == ("host-verified", False)
    assert (HUB_MADE.trust, HUB_MADE.hub_made) == ("host-verified", True)
    forwarded = Origin.forwarded_by(Context(uuid.uuid4()), signature_failed=True, attached=[b"head"])
    assert (forwarded.by, forwarded.trust, forwarded.hub_made) == ("forwarded", "lan-verified", False)
    assert (forwarded.signature_failed, forwarded.attached) == (True, (b"head",))


@pytest.mark.django_db
def test_a_hub_made_request_skips_the_senders_rate_limit_and_the_dedupe_window(settings: Any) -> None:
    settings.SWITCHBOARD_RATE_PAIR, settings.SWITCHBOARD_RATE_PAIR_SECONDS = 1, 10
    alice, _bob = session_register(name="alice").session, session_register(name="bob").session
    with time_machine.travel(timezone.now(), tick=False):
        message_send(SendRequest(sender=alice, to="bob", text="first"))
        with pytest.raises(RateLimited):
            message_send(SendRequest(sender=alice, to="bob", text="second"))
        made = [
            message_send(SendRequest(sender=alice, to="bob", text="idle", origin=HUB_MADE)) for _ in range(2)
        ]
    assert [outcome.duplicate for outcome in made] == [False, False]
    assert made[0].message.id != made[1].message.id


@pytest.mark.django_db
def test_a_forwarded_request_takes_its_id_tier_and_trust_from_its_context() -> None:
    sender, _bob = session_register(name="far").session, session_register(name="bob").session
    context = Context(uuid.uuid4())
    origin = Origin.forwarded_by(context, signature_failed=False, attached=[])
    outcome = message_send(SendRequest(sender=sender, to="bob", text="from afar", origin=origin))
    assert (outcome.message.id, outcome.delivery.tier, outcome.message.trust) == (
        context.message_id,
        "lan",
        "lan-verified",
    )


def _from_a_stranger() -> Origin:
    """The origin of a message a hub this hub does not vouch for forwarded here."""
    context = Context(uuid.uuid4(), trust="unverified", vouched=False)
    return Origin.forwarded_by(context, signature_failed=False, attached=[])


@pytest.mark.django_db
def test_a_request_forwarded_by_a_hub_nobody_vouched_for_reaches_only_an_exact_address() -> None:
    """Given bobby here, when a message that a hub this hub does not vouch for forwarded names him
    by a prefix, then the pipeline's own resolution finds nobody, alone or in a group of sends,
    and names nobody; by his exact name it reaches him, and a vouched hub's prefix still does."""
    far, bobby = session_register(name="far").session, session_register(name="bobby").session

    with pytest.raises(NotFound) as alone:
        message_send(SendRequest(sender=far, to="bob", text="one", origin=_from_a_stranger()))
    grouped = messages_send(
        [
            SendRequest(sender=far, to="bob", text="two", origin=_from_a_stranger()),
            SendRequest(sender=far, to="bobby", text="three", origin=_from_a_stranger()),
        ]
    )
    exact = message_send(SendRequest(sender=far, to="bobby", text="four", origin=_from_a_stranger()))
    vouched = Origin.forwarded_by(Context(uuid.uuid4()), signature_failed=False, attached=[])
    by_prefix = message_send(SendRequest(sender=far, to="bob", text="five", origin=vouched))

    assert "bobby" not in str(alone.value)
    assert isinstance(grouped[0], NotFound) and "bobby" not in str(grouped[0])
    assert not isinstance(grouped[1], NotFound) and grouped[1].recipient.id == bobby.id
    assert exact.recipient.id == bobby.id and by_prefix.recipient.id == bobby.id


@pytest.mark.django_db
def test_the_answer_says_when_a_queued_message_goes_to_the_recipients_socket_at_once(tmp_path: Any) -> None:
    """A session that listens on a socket (`peer_address`) is written to as the send commits; one
    that does not reads its messages at its next tool call or turn. The answer says which."""
    alice = session_register(name="alice").session
    hook = session_register(name="hooked").session
    listener = session_register(name="listening", peer_address=f"uds:{tmp_path / 'l.sock'}").session

    to_hook = message_send(SendRequest(sender=alice, to="hooked", text="one"))
    to_listener = message_send(SendRequest(sender=alice, to="listening", text="two"))

    assert to_hook.status == to_listener.status == "queued"
    assert to_hook.result == (
        f"Queued for hooked [{hook.ref}]: it reaches them at their next tool call or turn; do not resend."
    )
    assert to_listener.result == (
        f"Queued for listening [{listener.ref}]: the hub writes it to their socket listener now; "
        "do not resend."
    )
