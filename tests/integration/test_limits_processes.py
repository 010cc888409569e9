"""Loop protection holds across processes: two daphne web processes share one bucket (Redis) and
one dedupe window (PostgreSQL), so alternating between them buys a sender nothing."""

from __future__ import annotations

import secrets

import pytest

pytestmark = pytest.mark.integration


def test_the_pair_bucket_is_shared_by_two_web_processes(hub):
    # Given alice and bob registered through different web processes
    tag = secrets.token_hex(3)
    alice = hub.register(f"alice-limit-{tag}", web=0)
    bob = hub.register(f"bob-limit-{tag}", web=1)
    clients = [hub.client(0, headers=alice.headers), hub.client(1, headers=alice.headers)]
    try:
        # When alice sends 12 different messages as fast as she can, alternating web processes
        codes = []
        for i in range(12):
            r = clients[i % 2].post("/api/v1/messages", json={"to": bob.ref, "message": f"update {i}"})
            codes.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["reason"] == "pair_rate"
    finally:
        for c in clients:
            c.close()
    # Then the default burst of 10 went through and the rest were refused, whichever process took them
    assert codes[:10] == [201] * 10, codes
    assert codes[10:] == [429, 429], codes


def test_dedupe_spans_web_processes(hub):
    tag = secrets.token_hex(3)
    carol = hub.register(f"carol-dedupe-{tag}", web=0)
    dave = hub.register(f"dave-dedupe-{tag}", web=1)
    with hub.client(0, headers=carol.headers) as c0, hub.client(1, headers=carol.headers) as c1:
        first = c0.post("/api/v1/messages", json={"to": dave.ref, "message": "deploy finished"}).json()
        again = c1.post("/api/v1/messages", json={"to": dave.ref, "message": "deploy finished"}).json()
    assert again["duplicate"] is True and again["id"] == first["id"]
    assert hub.sql("SELECT count(*) FROM messaging_delivery WHERE recipient_id = %s", dave.id)[0][0] == 1
