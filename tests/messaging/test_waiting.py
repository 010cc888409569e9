"""Waiting for messages (`messaging.services.waiting`): woken by the wake-up on the session's group,
the database read after joining, polling when the channel layer fails, the deadline; and the
long-poll (`GET /api/v1/inbox?wait=`) that answers through it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from hub.asgi import application
from messaging.errors import Unauthorized
from messaging.models import Delivery
from messaging.principals import operator_principal, session_principal
from messaging.services import waiting
from messaging.services.delivery import inbox_pull
from messaging.services.events import session_group
from messaging.services.sessions import Registration, session_deregister, session_register
from messaging.services.waiting import INBOX_QUEUED, InboxSubscription, inbox_wait, wakes_inbox
from tests.agents.test_agent_websocket import register, send

pytestmark = [pytest.mark.django_db(transaction=True)]

LONG = 30.0  # a re-check or poll interval no test waits out


class BrokenLayer:
    """A channel layer whose Redis is down: every call fails."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def new_channel(self) -> str:
        self.calls.append("new_channel")
        raise ConnectionError("Redis is down")

    async def group_add(self, group: str, channel: str) -> None:
        raise ConnectionError("Redis is down")


class LayerThatFailsMidWait:
    """A channel layer that takes the subscription, then fails on the first read."""

    def __init__(self) -> None:
        self.groups: list[tuple[str, str]] = []
        self.discarded: list[tuple[str, str]] = []

    async def new_channel(self) -> str:
        return "wait.1"

    async def group_add(self, group: str, channel: str) -> None:
        self.groups.append((group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        self.discarded.append((group, channel))

    async def receive(self, channel: str) -> dict[str, Any]:
        raise ConnectionError("Redis went away")


def pull_texts(recipient: Registration) -> Any:
    """The caller's pull for `inbox_wait`: the texts it took."""

    @sync_to_async
    def take() -> list[str]:
        pulled = inbox_pull(recipient=recipient.session, actor=session_principal(recipient.session))
        return [d.message.text for d in pulled]

    return take


async def send_later(seconds: float, sender: Registration, to: str, text: str) -> str:
    await asyncio.sleep(seconds)
    return await send(sender, to, text)


def test_the_wake_up_is_inbox_queued_alone_or_among_a_group_s_events() -> None:
    wake_up = {"type": "hub.event", "kind": INBOX_QUEUED, "data": {}}
    receipt = {"type": "hub.event", "kind": "delivery.changed", "data": {}}

    assert wakes_inbox(wake_up)
    assert not wakes_inbox(receipt)
    assert wakes_inbox({"type": "hub.events", "events": [receipt, wake_up]})
    assert not wakes_inbox({"type": "hub.events", "events": [receipt, receipt]})


def test_a_queued_delivery_s_wake_up_goes_to_its_recipient_s_group_only() -> None:
    wake_up = waiting.inbox_wake_up(delivery_id=7, recipient_id="abc")

    assert wake_up.kind == INBOX_QUEUED
    assert list(wake_up.sessions) == ["abc"] and not wake_up.operators
    assert wake_up.data == {"delivery_id": 7, "recipient_id": "abc"}


@pytest.mark.asyncio
async def test_a_subscription_is_woken_by_the_wake_up_and_not_by_the_session_s_other_events() -> None:
    """On the Redis pub/sub layer (the PostgreSQL suite's), a read cancelled when a wait timed out
    dropped the channel and the wake-up published next with it."""
    layer = get_channel_layer()
    subscription = await InboxSubscription.join(layer, await layer.new_channel(), "s1")
    try:
        await layer.group_send(
            session_group("s1"), {"type": "hub.event", "kind": "session.changed", "data": {}}
        )
        assert await subscription.woken(0.3) is False
        await layer.group_send(
            session_group("s1"), {"type": "hub.events", "events": [{"kind": "x"}, {"kind": INBOX_QUEUED}]}
        )
        assert await subscription.woken(5) is True
    finally:
        await subscription.leave()


@pytest.mark.asyncio
async def test_a_wait_is_woken_by_a_send_not_by_its_re_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    monkeypatch.setattr(waiting, "POLL_SECONDS", LONG)
    alice, bob = await register("alice"), await register("bob")

    started = time.monotonic()
    taken, _ = await asyncio.gather(
        inbox_wait(
            recipient_id=bob.session.id, token_hash=bob.session.token_hash, seconds=LONG, take=pull_texts(bob)
        ),
        send_later(0.3, alice, "bob", "wake up"),
    )

    assert taken == ["wake up"]
    assert time.monotonic() - started < 10


@pytest.mark.asyncio
async def test_what_was_queued_before_the_wait_is_taken_at_once() -> None:
    alice, bob = await register("alice"), await register("bob")
    await send(alice, "bob", "already there")

    started = time.monotonic()
    taken = await inbox_wait(
        recipient_id=bob.session.id, token_hash=bob.session.token_hash, seconds=LONG, take=pull_texts(bob)
    )

    assert taken == ["already there"]
    assert time.monotonic() - started < 5


@pytest.mark.asyncio
async def test_at_the_deadline_a_wait_answers_nothing_and_leaves_the_group() -> None:
    bob = await register("bob")
    layer = LayerThatFailsMidWait()
    layer.receive = lambda channel: asyncio.sleep(LONG)  # type: ignore[method-assign]
    took: list[int] = []

    async def take() -> list[str]:
        took.append(1)
        return []

    started = time.monotonic()
    taken = await inbox_wait(
        recipient_id=bob.session.id, token_hash=bob.session.token_hash, seconds=0.3, take=take, layer=layer
    )

    assert taken == [] and took == []  # nothing queued: no pull
    assert 0.3 <= time.monotonic() - started < 5
    assert layer.groups == layer.discarded == [(session_group(bob.session.id), "wait.1")]


@pytest.mark.asyncio
async def test_a_wait_whose_pull_finds_nothing_waits_on_until_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another pull took the message between the check and this one's pull: keep waiting."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 0.05)
    alice, bob = await register("alice"), await register("bob")
    await send(alice, "bob", "taken by another")
    pulls: list[int] = []

    async def take_nothing() -> list[str]:
        pulls.append(1)
        return []

    started = time.monotonic()
    taken = await inbox_wait(
        recipient_id=bob.session.id, token_hash=bob.session.token_hash, seconds=0.5, take=take_nothing
    )

    assert taken == [] and len(pulls) >= 2
    assert time.monotonic() - started >= 0.5


@pytest.mark.asyncio
async def test_with_the_layer_down_a_wait_polls_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    alice, bob = await register("alice"), await register("bob")
    layer = BrokenLayer()

    started = time.monotonic()
    taken, _ = await asyncio.gather(
        inbox_wait(
            recipient_id=bob.session.id,
            token_hash=bob.session.token_hash,
            seconds=LONG,
            take=pull_texts(bob),
            layer=layer,
        ),
        send_later(0.3, alice, "bob", "found by polling"),
    )

    assert taken == ["found by polling"]
    assert layer.calls == ["new_channel"]
    assert time.monotonic() - started < 10


@pytest.mark.asyncio
async def test_a_layer_that_fails_mid_wait_turns_the_wait_into_polling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    alice, bob = await register("alice"), await register("bob")
    layer = LayerThatFailsMidWait()

    taken, _ = await asyncio.gather(
        inbox_wait(
            recipient_id=bob.session.id,
            token_hash=bob.session.token_hash,
            seconds=LONG,
            take=pull_texts(bob),
            layer=layer,
        ),
        send_later(0.3, alice, "bob", "after the layer failed"),
    )

    assert taken == ["after the layer failed"]
    assert layer.groups == [(session_group(bob.session.id), "wait.1")]
    assert layer.discarded == []  # the layer is gone: nothing to leave


class CountingLayer(LayerThatFailsMidWait):
    """A channel layer whose reads wait for what is put in `messages`, counting those cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.cancelled_reads = 0

    async def receive(self, channel: str) -> dict[str, Any]:
        try:
            return await self.messages.get()
        except asyncio.CancelledError:
            self.cancelled_reads += 1
            raise


@pytest.mark.asyncio
async def test_a_wait_woken_lets_its_channel_go_by_cancelling_its_pending_read() -> None:
    """channels_redis' pub/sub layer drops a channel only when a read of it is cancelled: a wait
    that ends leaves a read pending and cancels it, whether it was woken or timed out."""
    alice, bob = await register("alice"), await register("bob")
    layer = CountingLayer()

    async def wake_later() -> None:
        await send_later(0.2, alice, "bob", "woken")
        await layer.messages.put({"type": "hub.event", "kind": INBOX_QUEUED, "data": {}})

    taken, _ = await asyncio.gather(
        inbox_wait(
            recipient_id=bob.session.id,
            token_hash=bob.session.token_hash,
            seconds=LONG,
            take=pull_texts(bob),
            layer=layer,
        ),
        wake_later(),
    )
    await asyncio.sleep(0)  # the cancelled read runs to its end

    assert taken == ["woken"]
    assert layer.cancelled_reads == 1
    assert layer.discarded == [(session_group(bob.session.id), "wait.1")]


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://localhost")


@pytest.mark.asyncio
async def test_a_long_poll_answers_with_a_message_sent_while_it_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    alice, bob = await register("alice"), await register("bob")
    headers = {"Authorization": f"Bearer {bob.token}"}

    async with client() as http:
        answer, _ = await asyncio.gather(
            http.get("/api/v1/inbox", params={"wait": 20}, headers=headers, timeout=30),
            send_later(0.3, alice, "bob", "long-polled"),
        )
        nothing = await http.get("/api/v1/inbox", params={"wait": 0.2}, headers=headers, timeout=30)

    assert answer.status_code == 200
    assert [m["text"] for m in answer.json()["messages"]] == ["long-polled"]
    assert nothing.json() == {"messages": []}
    state = await sync_to_async(lambda: Delivery.objects.get(recipient=bob.session).state)()
    assert state == "delivered"


@pytest.mark.asyncio
async def test_a_long_poll_with_the_layer_down_answers_from_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "get_channel_layer", BrokenLayer)
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.05)
    alice, bob = await register("alice"), await register("bob")

    async with client() as http:
        answer, _ = await asyncio.gather(
            http.get("/api/v1/inbox", params={"wait": 20}, headers={"Authorization": f"Bearer {bob.token}"}),
            send_later(0.3, alice, "bob", "polled"),
        )

    assert answer.status_code == 200
    assert [m["text"] for m in answer.json()["messages"]] == ["polled"]


# --- a wait whose token is revoked ---------------------------------------------------------------

BOB_KEY = "bob-registration-key-0123456789"


@sync_to_async
def register_with_key(name: str, key: str) -> Registration:
    return session_register(name=name, registration_key=key)


@sync_to_async
def end_session(session: Any) -> None:
    """What an operator's "end session" does (`POST /api/v1/sessions/{ref}/end`)."""
    session_deregister(session=session, actor=operator_principal("ops"))


@sync_to_async
def delivery_states(recipient: Registration) -> list[str]:
    return list(Delivery.objects.filter(recipient=recipient.session).values_list("state", flat=True))


def test_session_closed_sends_a_wait_back_to_the_database_but_is_no_wake_up() -> None:
    closed = {"type": "hub.event", "kind": "session.closed", "data": {"status": "token_reissued"}}
    receipt = {"type": "hub.event", "kind": "delivery.changed", "data": {}}

    assert waiting.wakes_wait(closed) and not wakes_inbox(closed)
    assert waiting.wakes_wait({"type": "hub.events", "events": [receipt, closed]})
    assert not waiting.wakes_wait(receipt)


@pytest.mark.asyncio
async def test_a_wait_whose_token_was_replaced_before_it_joined_takes_nothing() -> None:
    """Given a message queued for bob, when the token a wait authenticated with was replaced
    between the authentication and the wait (no event reaches it), then the wait raises 401 at
    its first read of the database without pulling, and the message stays queued."""
    alice, bob = await register("alice"), await register_with_key("bob", BOB_KEY)
    await send(alice, "bob", "queued before")
    await register_with_key("bob", BOB_KEY)
    took: list[int] = []

    async def take() -> list[str]:
        took.append(1)
        return []

    with pytest.raises(Unauthorized, match="replaced"):
        await inbox_wait(
            recipient_id=bob.session.id, token_hash=bob.session.token_hash, seconds=LONG, take=take
        )

    assert took == []
    assert await delivery_states(bob) == ["queued"]


@pytest.mark.asyncio
async def test_with_the_layer_down_a_wait_ends_when_its_session_is_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No event can reach a wait that polls the database: the poll itself finds the token revoked."""
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.05)
    bob = await register("bob")

    async def end_later() -> None:
        await asyncio.sleep(0.3)
        await end_session(bob.session)

    started = time.monotonic()
    with pytest.raises(Unauthorized, match="exited"):
        await asyncio.gather(
            inbox_wait(
                recipient_id=bob.session.id,
                token_hash=bob.session.token_hash,
                seconds=LONG,
                take=pull_texts(bob),
                layer=BrokenLayer(),
            ),
            end_later(),
        )
    assert time.monotonic() - started < 10


def first_wait_started(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set when a wait has read the database and waits on its channel (its first `woken`). A test
    that writes only after it keeps its thread off the database while the request's thread reads:
    the fast suite's in-memory SQLite refuses a write then ("database table is locked")."""
    started = asyncio.Event()
    woken = waiting.InboxSubscription.woken

    async def first_woken(self: waiting.InboxSubscription, seconds: float) -> bool:
        started.set()
        return await woken(self, seconds)

    monkeypatch.setattr(waiting.InboxSubscription, "woken", first_woken)
    return started


@pytest.mark.asyncio
async def test_a_long_poll_waiting_with_a_token_that_is_reissued_ends_401_and_takes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a long-poll waiting with bob's token (say, a stolen one), when a registration retried
    with bob's registration key replaces the token and a message is sent to bob, then the poll
    answers 401 at once and takes nothing: the message stays queued for the new token's holder."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    waiting_now = first_wait_started(monkeypatch)
    alice, bob = await register("alice"), await register_with_key("bob", BOB_KEY)
    renewed: list[Registration] = []

    async def reissue_then_send(poll: asyncio.Task) -> None:
        await asyncio.wait_for(waiting_now.wait(), 10)
        renewed.append(await register_with_key("bob", BOB_KEY))
        # The send waits for the poll's answer, up to a second: a poll that went on waiting would
        # take it (and the send stays off the database while the woken poll reads it).
        await asyncio.wait([poll], timeout=1)
        await send(alice, "bob", "for the rightful holder")

    async with client() as http:
        started = time.monotonic()
        stolen = asyncio.ensure_future(
            http.get(
                "/api/v1/inbox",
                params={"wait": 5},
                headers={"Authorization": f"Bearer {bob.token}"},
                timeout=30,
            )
        )
        answer, _ = await asyncio.gather(stolen, reissue_then_send(stolen))
        elapsed = time.monotonic() - started
        assert renewed[0].reissued
        assert answer.status_code == 401
        assert answer.json()["error"] == "unauthorized"
        assert elapsed < 4  # ended by the revocation, not by the deadline
        assert await delivery_states(bob) == ["queued"]

        rightful = await http.get(
            "/api/v1/inbox", headers={"Authorization": f"Bearer {renewed[0].token}"}, timeout=30
        )

    assert [m["text"] for m in rightful.json()["messages"]] == ["for the rightful holder"]


@pytest.mark.asyncio
async def test_a_long_poll_waiting_when_its_session_is_ended_ends_401_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a long-poll waiting with bob's token, when an operator ends bob's session, then the
    poll answers 401 at once instead of waiting out its deadline."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    waiting_now = first_wait_started(monkeypatch)
    bob = await register("bob")

    async def end_later() -> None:
        await asyncio.wait_for(waiting_now.wait(), 10)
        await end_session(bob.session)

    async with client() as http:
        started = time.monotonic()
        stolen = http.get(
            "/api/v1/inbox", params={"wait": 5}, headers={"Authorization": f"Bearer {bob.token}"}, timeout=30
        )
        answer, _ = await asyncio.gather(stolen, end_later())

    assert answer.status_code == 401
    assert answer.json()["error"] == "unauthorized"
    assert "exited" in answer.json()["detail"]
    assert time.monotonic() - started < 4


@pytest.mark.asyncio
async def test_one_token_holds_a_bounded_number_of_long_polls_at_once(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The attack: eve opens long-polls with her one token without end; each waits up to a minute
    and reads the database every few seconds, so enough of them load the hub for everyone. Past
    SWITCHBOARD_WAITS_PER_SESSION waits at once, her next is refused at once (429, nothing taken);
    bob's waits go on, and hers once one of her waits ended."""
    settings.SWITCHBOARD_WAITS_PER_SESSION = 2
    settings.SWITCHBOARD_LIMITS_PREFIX = f"test-waits-{time.monotonic_ns()}"
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", LONG)
    eve, bob = await register("eve"), await register("bob")
    eves, bobs = {"Authorization": f"Bearer {eve.token}"}, {"Authorization": f"Bearer {bob.token}"}

    async with client() as http:

        async def one_too_many() -> tuple[Any, Any, float]:
            await asyncio.sleep(0.5)  # eve's two waits are under way
            started = time.monotonic()
            refused = await http.get("/api/v1/inbox", params={"wait": 20}, headers=eves, timeout=30)
            elapsed = time.monotonic() - started
            others = await http.get("/api/v1/inbox", params={"wait": 0.2}, headers=bobs, timeout=30)
            return refused, others, elapsed

        first, second, (refused, others, elapsed) = await asyncio.gather(
            http.get("/api/v1/inbox", params={"wait": 2}, headers=eves, timeout=30),
            http.get("/api/v1/inbox", params={"wait": 2}, headers=eves, timeout=30),
            one_too_many(),
        )
        again = await http.get("/api/v1/inbox", params={"wait": 0.2}, headers=eves, timeout=30)

    assert (first.status_code, second.status_code) == (200, 200)
    assert refused.status_code == 429, refused.json()
    assert (refused.json()["error"], refused.json()["reason"]) == ("rate_limited", "too_many_waits")
    assert refused.json()["retry_after"] > 0 and elapsed < 1.5
    assert others.status_code == 200
    assert again.status_code == 200
