"""A relay's word on where a name is, and what a hostile relay can make of it. A sender asks the
relay "which hub holds X?" and seals X's messages to the key it names; the relay cannot name its
own key (only a key an operator pinned is sealed to), but it could name another pinned hub, which
would then read messages that are not its own. So a lease carries the leasing hub's own signed
statement (name, its key, the relay's key, a time window), the relay shows it with its answer,
and the sender believes the relay only as far as that statement goes.

The relay here is the real relay service on this test's database (`relay_lookup`, `relay_store`,
`relay_agents`, run in relay role); only the transport between the hub and it is replaced, and a
hostile relay is that service with its answer rewritten.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.utils import timezone
from nacl.public import SealedBox
from nacl.signing import SigningKey

from federation.errors import LeaseStatementRefused
from federation.models import RelayLease, RelayMessage
from federation.services.identity import hub_identity
from federation.services.relay import (
    relay_agents,
    relay_lease_entry_problem,
    relay_lease_take,
    relay_lookup,
    relay_pull,
    relay_store,
)
from federation.services.signatures import (
    LEASE_CLOCK_SLACK_SECONDS,
    lease_statement_digest_input,
    lease_statement_problem,
    sign_bytes,
)
from messaging.models import AuditEvent
from tests.federation.conftest import (
    OtherHub,
    _federation_dirs,  # noqa: F401  (autouse: registry, files, caches)
    pin_hub,
)

pytestmark = pytest.mark.django_db(transaction=True)

RELAY_URL = "http://127.0.0.1:9"  # never connected to: the transport is the relay service itself


class InProcessRelay:
    """The relay service, on this test's database, as this hub's transport meets it: each call
    runs the real relay function in relay role. `tamper` rewrites the answer to "who holds X?",
    and `listed_too` adds rows to the list of leased names, as a hostile relay would. The relay's
    key is this process's
    hub key, which is the key this hub holds for its relay."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.calls: list[tuple[str, str]] = []
        self.tamper: Callable[[dict[str, Any]], dict[str, Any]] = lambda answer: answer
        self.listed_too: list[dict[str, Any]] = []  # rows a hostile relay adds to its list

    @contextmanager
    def role(self) -> Iterator[None]:
        self.settings.SWITCHBOARD_ROLE = "relay"
        try:
            yield
        finally:
            self.settings.SWITCHBOARD_ROLE = "hub"

    def __call__(self, method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        assert base_url == RELAY_URL and kw["dest_key"] == hub_identity().public_key
        split = urlsplit(path)
        self.calls.append((method, split.path))
        with self.role():
            if (method, split.path) == ("GET", "/relay/agents"):
                asked = parse_qs(split.query).get("to")
                if asked:
                    return self.tamper(relay_lookup(target=asked[0]))
                return {"agents": [*relay_agents(), *self.listed_too]}
            if (method, split.path) == ("POST", "/relay/messages"):
                row, created = relay_store(
                    from_hub=hub_identity().public_key,
                    kind="message",
                    message_id=body["message_id"],
                    dest_hub=body["dest_hub"],
                    agent=body["agent"],
                    sealed=body["sealed"],
                )
                return {"id": str(row.id), "created": created}
        raise AssertionError(f"the hub called the relay at {method} {path}")

    def lease(self, hub: OtherHub, agent: str) -> None:
        """`hub` takes its lease on `agent` here, with its own statement (as its pull does)."""
        with self.role():
            relay_lease_take(hub_key=hub.public_key, agent=agent, statement=hub.lease(agent))

    def lookup(self, agent: str) -> dict[str, Any]:
        with self.role():
            return relay_lookup(target=agent)

    def pinned_hub(self, name: str, agent: str) -> OtherHub:
        """A hub this hub's operator pinned (relay tier), leasing `agent` here with its statement."""
        hub = OtherHub(SigningKey.generate(), name=name)
        pin_hub(hub, tier="relay")
        self.lease(hub, agent)
        return hub


@pytest.fixture
def relay(settings: Any, monkeypatch: pytest.MonkeyPatch) -> InProcessRelay:
    """This hub's relay, with its key configured (the key this process signs with in relay role)."""
    settings.SWITCHBOARD_RELAY_URL = RELAY_URL
    settings.SWITCHBOARD_RELAY_KEY = hub_identity().public_key
    transport = InProcessRelay(settings)
    monkeypatch.setattr("federation.services.forwarding.hub_call", transport)
    monkeypatch.setattr("federation.services.discovery.hub_call", transport)
    return transport


@pytest.fixture
def carols_hub(relay: InProcessRelay) -> OtherHub:
    """The hub carol is live in: pinned by this hub's operator, leasing carol at the relay."""
    return relay.pinned_hub("carols-hub", "carol")


@pytest.fixture
def kays_hub(relay: InProcessRelay) -> OtherHub:
    """Another hub this hub's operator pinned (trusted for its own agents' messages, such as kay)."""
    return relay.pinned_hub("kays-hub", "kay")


def _send(api: Any, sender: Any, capture: Any, to: str = "carol") -> Any:
    with capture(execute=True):
        return api.post("messages", sender.token, {"to": to, "message": f"for {to} only"})


def _statement_signed(key: SigningKey, **facts: Any) -> dict[str, Any]:
    """A lease statement with exactly `facts`, signed by `key` (whatever it says)."""
    return {
        "v": "switchboard-lease-1",
        **facts,
        "signature": sign_bytes(lease_statement_digest_input(**facts), key=key),
    }


# --- the attack: the relay names another pinned hub for carol ---------------------------------------

FORGERIES: dict[str, Callable[[OtherHub, OtherHub, dict[str, Any]], Any]] = {
    # What an older relay (or one that drops statements) answers.
    "no statement": lambda kay, carol, kays_own: None,
    # Kay's hub's genuine statement, for its own agent.
    "another name": lambda kay, carol, kays_own: kays_own,
    # Kay's hub's genuine statement for carol, made for another relay.
    "another relay": lambda kay, carol, kays_own: kay.lease(
        "carol", relay_key=OtherHub(SigningKey.generate()).public_key
    ),
    # Kay's hub's genuine statement for carol at this relay, from an hour ago.
    "expired": lambda kay, carol, kays_own: kay.lease("carol", now=time.time() - 3600),
    # Carol's hub's genuine statement, shown as kay's hub's.
    "another hub's statement": lambda kay, carol, kays_own: carol.lease("carol"),
    # A statement naming kay's hub for carol, signed by a key the relay made.
    "signed by another key": lambda kay, carol, kays_own: _statement_signed(
        SigningKey.generate(),
        agent="carol",
        hub=kay.public_key,
        relay=hub_identity().public_key,
        issued_at=int(time.time()),
        valid_until=int(time.time()) + 60,
    ),
    # Kay's hub's statement for carol, good for a day: what a relay could hand out long after.
    "longer than a lease": lambda kay, carol, kays_own: _statement_signed(
        kay.key,
        agent="carol",
        hub=kay.public_key,
        relay=hub_identity().public_key,
        issued_at=int(time.time()),
        valid_until=int(time.time()) + 86400,
    ),
}


@pytest.mark.parametrize("forged", list(FORGERIES))
def test_a_relay_naming_another_pinned_hub_for_carol_gets_it_nothing(
    api: Any,
    register: Any,
    relay: InProcessRelay,
    carols_hub: OtherHub,
    kays_hub: OtherHub,
    forged: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Given carol is live in a pinned hub and leased there, and kay's hub is pinned too, when the
    relay answers "who holds carol?" with kay's hub's key (with no statement, or one that is not
    kay's hub's own word for carol at this relay, now, for no longer than a lease), then this hub
    does not route there: nothing is sealed or stored for kay's hub, the send finds no hub for
    carol, and the refusal is logged and audited (`federation.lease_unverified`, once)."""
    kays_own = relay.lookup("kay")["statement"]
    statement = FORGERIES[forged](kays_hub, carols_hub, kays_own)
    relay.tamper = lambda answer: dict(answer, hub_key=kays_hub.public_key, statement=statement)
    alice = register("alice")

    sent = _send(api, alice, django_capture_on_commit_callbacks)
    again = _send(api, alice, django_capture_on_commit_callbacks)

    assert not RelayMessage.objects.filter(dest_hub=kays_hub.public_key).exists()
    assert ("POST", "/relay/messages") not in relay.calls
    assert (sent.status_code, sent.json_body.get("error")) == (404, "not_found"), sent.json_body
    assert again.status_code == 404
    [refused] = AuditEvent.objects.filter(kind="federation.lease_unverified")
    assert refused.target == RELAY_URL
    assert (refused.detail["agent"], refused.detail["hub_key"]) == ("carol", kays_hub.public_key)


def test_a_lease_its_hub_signed_routes_as_before_sealed_to_that_hub(
    api: Any,
    register: Any,
    relay: InProcessRelay,
    carols_hub: OtherHub,
    kays_hub: OtherHub,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Given carol's hub leased carol with its statement, when alice sends to carol, then the
    message is relayed: stored at the relay for carol's hub, sealed to it and signed for it."""
    alice = register("alice")

    sent = _send(api, alice, django_capture_on_commit_callbacks)

    assert (sent.status_code, sent.json_body["status"]) == (201, "relayed"), sent.json_body
    [stored] = RelayMessage.objects.all()
    assert (stored.dest_hub, stored.agent_key) == (carols_hub.public_key, "carol")
    opened = json.loads(SealedBox(carols_hub.key.to_curve25519_private_key()).decrypt(bytes(stored.sealed)))
    assert opened["dest"] == carols_hub.public_key and opened["text"] == "for carol only"
    assert not AuditEvent.objects.filter(kind="federation.lease_unverified").exists()


def test_the_relays_directory_lists_only_names_whose_hub_signed_the_lease(
    api: Any, register: Any, relay: InProcessRelay, carols_hub: OtherHub, kays_hub: OtherHub
) -> None:
    """Given the relay lists carol and kay (each with its hub's statement) and adds dave, naming
    kay's hub with its statement for kay, then the directory this hub shows its agents has carol
    and kay from the relay, not the name it has no hub's word for."""
    relay.listed_too = [dict(relay.lookup("kay"), name="dave", hub_key=kays_hub.public_key)]

    listed = api.get("agents", register("alice").token).json_body["agents"]

    assert sorted(a["name"] for a in listed if a.get("tier") == "relay") == ["carol", "kay"]


def test_the_directory_keeps_the_relays_list_no_longer_than_its_first_statement_holds(
    relay: InProcessRelay, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Given the relay lists kay with a statement that ends in 10 s, then the directory keeps the
    relay's list for those 10 s, not SWITCHBOARD_HOSTS_CACHE_SECONDS: it asks the relay again
    rather than show kay past what kay's hub signed (as "who holds kay?" is kept)."""
    from types import SimpleNamespace

    from federation.services import lookups
    from federation.services.discovery import remote_agents_list

    clock = [1000.0]
    monkeypatch.setattr(lookups, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    kays = OtherHub(SigningKey.generate(), name="kays-hub")
    pin_hub(kays, tier="relay")
    with relay.role():
        relay_lease_take(
            hub_key=kays.public_key,
            agent="kay",
            statement=kays.lease("kay", now=time.time() - settings.SWITCHBOARD_RELAY_LEASE_SECONDS - 20),
        )
    assert [r["name"] for r in remote_agents_list()] == ["kay"]
    asked = relay.calls.count(("GET", "/relay/agents"))
    clock[0] += 9
    remote_agents_list()
    assert relay.calls.count(("GET", "/relay/agents")) == asked
    clock[0] += 2
    remote_agents_list()
    assert relay.calls.count(("GET", "/relay/agents")) == asked + 1


# --- the relay: no lease without its hub's statement ------------------------------------------------


@pytest.fixture
def relay_role(settings: Any) -> None:
    settings.SWITCHBOARD_ROLE = "relay"


def test_the_relay_takes_no_lease_without_a_statement_that_holds(relay_role: None) -> None:
    """An older hub's lease (no statement), and statements for another name, another relay, an
    expired one or one by another key, are refused, and nothing is leased: a sender is never
    shown a lease it could not believe."""
    hub, other = OtherHub(SigningKey.generate()), OtherHub(SigningKey.generate())
    elsewhere = OtherHub(SigningKey.generate()).public_key
    for statement in (
        None,
        hub.lease("kay"),
        hub.lease("carol", relay_key=elsewhere),
        hub.lease("carol", now=time.time() - 3600),
        other.lease("carol"),
    ):
        with pytest.raises(LeaseStatementRefused):
            relay_lease_take(hub_key=hub.public_key, agent="carol", statement=statement)
    assert not RelayLease.objects.exists()
    assert relay_lookup(target="carol") == {"hosted": False}
    answer = relay_pull(hub_key=hub.public_key, agents=["carol"])
    assert answer["leases"] == {"carol": "bad_statement"}


def test_an_older_hubs_lease_call_is_refused_with_the_reason(relay_role: None, hub_client: Any) -> None:
    """`POST /relay/leases` without a statement (what an older hub sends) answers 400
    `bad_lease_statement` saying why; with its statement, the lease is taken."""
    other_hub = OtherHub(SigningKey.generate())
    refused = other_hub.call(hub_client, "POST", "/api/v1/relay/leases", {"agent": "carol"})
    assert (refused.status_code, refused.json_body["error"]) == (400, "bad_lease_statement")
    assert "signed statement" in refused.json_body["detail"]
    taken = other_hub.call(
        hub_client, "POST", "/api/v1/relay/leases", {"agent": "carol", "statement": other_hub.lease("carol")}
    )
    assert taken.status_code == 200, taken.json_body


def test_a_statement_good_for_ages_takes_a_lease_for_a_lease_period(
    relay_role: None, hub_client: Any, settings: Any
) -> None:
    """A key signs its own statement, window and all: one good until a year no date reaches
    (timestamp 10**12) is still a lease for the relay's lease period, answered 200, not a fault of
    the relay (500)."""
    squatter = OtherHub(SigningKey.generate())
    now = int(time.time())
    statement = _statement_signed(
        squatter.key,
        agent="carol",
        hub=squatter.public_key,
        relay=hub_identity().public_key,
        issued_at=now,
        valid_until=10**12,
    )

    taken = squatter.call(
        hub_client, "POST", "/api/v1/relay/leases", {"agent": "carol", "statement": statement}
    )

    assert taken.status_code == 200, taken.content
    lease = RelayLease.objects.get(agent_key="carol")
    assert lease.expires_at <= timezone.now() + timedelta(seconds=settings.SWITCHBOARD_RELAY_LEASE_SECONDS)


def test_one_key_holds_a_bounded_number_of_leases(relay_role: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a key made at home that leases name after name (500 in each pull, as many pulls as it
    likes), then it holds at most LEASES_PER_HUB live leases: the next new name is refused (429
    `relay_quota`; `quota_full` in a pull's `leases`), its own leases still renew, and another key
    still leases the name. (A hub's pull renews at most 500 names; the bound leaves it room while
    leases it no longer renews lapse.)"""
    from federation.errors import RelayQuotaFull
    from federation.services import relay as relay_service
    from federation.services.relay import relay_pull

    monkeypatch.setattr(relay_service, "LEASES_PER_HUB", 3)
    squatter, genuine = OtherHub(SigningKey.generate()), OtherHub(SigningKey.generate())
    for name in ("ann", "ben", "cal"):
        relay_lease_take(hub_key=squatter.public_key, agent=name, statement=squatter.lease(name))

    with pytest.raises(RelayQuotaFull):
        relay_lease_take(hub_key=squatter.public_key, agent="dan", statement=squatter.lease("dan"))
    names = ["ann", "dan"]
    pulled = relay_pull(
        hub_key=squatter.public_key, agents=names, statements={n: squatter.lease(n) for n in names}
    )

    assert pulled["leases"] == {"ann": "ok", "dan": "quota_full"}
    assert RelayLease.objects.filter(hub_key=squatter.public_key).count() == 3
    relay_lease_take(hub_key=genuine.public_key, agent="dan", statement=genuine.lease("dan"))
    assert relay_lookup(target="dan")["hub_key"] == genuine.public_key


def test_a_lease_from_before_statements_is_not_shown_until_its_hub_renews_it(relay_role: None) -> None:
    """A lease row kept from before statements existed is neither answered nor listed; its hub's
    next renewal (with a statement) makes it one a sender can check."""
    hub = OtherHub(SigningKey.generate())
    RelayLease.objects.create(
        agent_key="carol",
        agent_name="carol",
        hub_key=hub.public_key,
        expires_at=timezone.now() + timedelta(minutes=1),
    )
    assert relay_lookup(target="carol") == {"hosted": False} and relay_agents() == []
    relay_lease_take(hub_key=hub.public_key, agent="carol", statement=hub.lease("carol"))
    assert relay_lookup(target="carol")["statement"]["hub"] == hub.public_key


def test_a_renewal_keeps_the_fresh_statement_and_the_lease_ends_with_it(
    relay_role: None, settings: Any
) -> None:
    """A hub's renewal replaces the statement the relay shows; a lease never outlasts its
    statement, whatever the relay's own lease period."""
    hub = OtherHub(SigningKey.generate())
    first = hub.lease("carol", now=time.time() - 20)
    second = hub.lease("carol")
    settings.SWITCHBOARD_RELAY_LEASE_SECONDS = 3600  # the relay's: longer than the statements'
    relay_lease_take(hub_key=hub.public_key, agent="carol", statement=first)
    lease = relay_lease_take(hub_key=hub.public_key, agent="carol", statement=second)
    assert relay_lookup(target="carol")["statement"] == second
    assert lease.expires_at.timestamp() == second["valid_until"]


def test_the_relay_keeps_of_a_statement_only_what_its_signature_covers(relay_role: None) -> None:
    """Given a key made at home that leases a name with its genuine statement padded with a field
    of its own (a megabyte here; a hub-to-hub body may carry 280 MB), then the relay keeps and
    hands every sender who asks, and every reader of its list, the signed statement alone: a lease
    costs the relay, and each answer naming it, a statement's few hundred bytes, and the statement
    it shows still holds for the name."""
    squatter = OtherHub(SigningKey.generate(), name="squatter")
    statement = dict(squatter.lease("carol"), pad="x" * 1_000_000)
    lease = relay_lease_take(hub_key=squatter.public_key, agent="carol", statement=statement)

    shown = relay_lookup(target="carol")
    listed = relay_agents()

    assert sorted(lease.statement) == sorted(squatter.lease("carol"))
    assert shown["statement"] == listed[0]["statement"] == lease.statement
    assert len(json.dumps(listed)) < 2000
    assert relay_lease_entry_problem(shown, asked="carol", relay_key=hub_identity().public_key) is None


# --- the leasing hub: a fresh statement with every renewal that needs one ---------------------------


def test_the_pull_sends_each_name_with_a_statement_and_signs_afresh_before_it_runs_short(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pull renews every live agent's lease with this hub's statement for the relay's key;
    a statement is sent again while at least a lease period of it is left, then signed afresh, so
    a renewed lease always carries a fresh statement."""
    from federation.services.relay import relay_pull_once

    relay_public = OtherHub(SigningKey.generate()).public_key
    settings.SWITCHBOARD_RELAY_URL = RELAY_URL
    settings.SWITCHBOARD_RELAY_KEY = relay_public
    bodies: list[dict[str, Any]] = []

    def relay_answers(method: str, base_url: str, path: str, body: Any = None, **kw: Any) -> Any:
        bodies.append(body)
        return {"leases": {"ops": "ok"}, "messages": [], "receipts": [], "more": False}

    monkeypatch.setattr("federation.services.relay.hub_call", relay_answers)
    me = hub_identity().public_key
    relay_pull_once(sessions=[{"name": "Ops"}])
    relay_pull_once(sessions=[{"name": "Ops"}])
    with time_machine.travel(time.time() + LEASE_CLOCK_SLACK_SECONDS + 1, tick=False):
        relay_pull_once(sessions=[{"name": "Ops"}])
        statements = [body["statements"]["Ops"] for body in bodies]
        for statement in statements[1:]:
            assert lease_statement_problem(statement, hub_key=me, agent="ops", relay_key=relay_public) is None
    assert statements[0] == statements[1] and statements[2]["issued_at"] > statements[1]["issued_at"]
    assert [body["agents"] for body in bodies] == [["Ops"]] * 3
