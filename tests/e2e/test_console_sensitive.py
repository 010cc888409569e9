"""An escalated hold in a real headless Chromium: the secret shows masked, approving without a
reason is refused, revealing the text is a deliberate, audited act, and approving with a reason
delivers the text as sent. (Hub, browser and log-in as in test_console_browser.py.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hub_fixtures.sensitivity_corpus import AWS_SECRET
from tests.e2e.console_world import World, delivery_id_of, hold_row, log_in, show_hold, wait_live

pytestmark = pytest.mark.e2e

SECRET_TEXT = f"creds for the deploy: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} (rotate after)"
MASKED = f"[AWS secret access key {AWS_SECRET[:4]}…{AWS_SECRET[-4:]}]"


def _revealed(world: World, message_id: str) -> list[dict[str, Any]]:  # noqa: F811
    events = world.operator("GET", "audit?kind=message.revealed&limit=1000")["events"]
    return [e for e in events if e["message_id"] == message_id]


def test_an_escalated_hold_is_masked_revealed_on_purpose_and_approved_only_with_a_reason(
    world: World,  # noqa: F811
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    alice, bob = world.register("alice-secret"), world.register("bob-secret")
    page = log_in(browser, world, viewport={"width": 1400, "height": 700})
    page.goto(world.hub.url + "/holds/")
    wait_live(page)

    # Given alice pastes an AWS secret key to bob, the hold appears live, escalated and masked.
    sent = world.send(alice, f"{bob.name} [{bob.ref}]", SECRET_TEXT, summary="deploy creds")
    assert (sent["status"], sent["tier"]) == ("held", "sensitive")
    row = show_hold(page, delivery_id_of(world, sent["id"]))
    text = row.inner_text()
    assert MASKED in text and AWS_SECRET not in text
    assert "sensitive: AWS secret access key" in text and "escalated" in text.lower()
    assert AWS_SECRET not in page.content()
    shots = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS") or tmp_path)
    page.screenshot(path=str(shots / "holds-sensitive.png"), full_page=True)

    # When the operator approves without a reason, the hub refuses and the hold stays.
    row.get_by_role("button", name="Approve").click()
    page.wait_for_selector('#notice[data-kind="error"]', timeout=5_000)
    assert "takes a reason" in page.locator("#notice").inner_text()
    assert row.is_visible()
    assert world.status(sent["id"])["status"] == "held"

    # The message page masks too; revealing is a button, and the reveal is audited.
    row.locator('a[data-link="message"]').click()
    page.wait_for_selector("[data-reveal]")
    assert MASKED in page.locator("[data-message-text]").inner_text()
    assert AWS_SECRET not in page.content()
    assert _revealed(world, sent["id"]) == []
    page.locator("[data-reveal]").click()
    page.wait_for_selector("[data-revealed]")
    assert page.locator("[data-message-text]").inner_text() == SECRET_TEXT
    [event] = _revealed(world, sent["id"])
    assert event["actor"] == f"operator:{'ada'}"
    assert AWS_SECRET not in str(event)

    # Approving with a reason queues it; bob gets the text exactly as sent.
    page.goto(world.hub.url + "/holds/")
    wait_live(page)
    row = show_hold(page, delivery_id_of(world, sent["id"]))
    row.locator('input[name="reason"]').fill("rotating the key right after the deploy")
    row.get_by_role("button", name="Approve").click()
    row.wait_for(state="detached", timeout=5_000)
    [got] = world.inbox(bob)
    assert got["text"] == SECRET_TEXT
    page.context.close()


def test_a_revealed_message_page_stays_live(world: World, browser: Any) -> None:  # noqa: F811
    alice, bob = world.register("alice-reveal-live"), world.register("bob-reveal-live")
    sent = world.send(alice, f"{bob.name} [{bob.ref}]", SECRET_TEXT)
    page = log_in(browser, world)
    failed: list[str] = []
    page.on(
        "response",
        lambda r: failed.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 400 else None,
    )
    page.goto(world.hub.url + f"/messages/{sent['id']}/")
    wait_live(page)
    page.locator("[data-reveal]").click()
    page.wait_for_selector("[data-revealed]")
    wait_live(page)

    # When another operator approves it, the revealed page shows the new state without a reload,
    # re-read from the message's own address (the reveal's form address answers only a POST).
    world.operator("POST", f"holds/{delivery_id_of(world, sent['id'])}/approve", {"reason": "rotated"})
    page.wait_for_function(
        "() => !document.querySelector('[data-live-region=\"deliveries\"]').innerText.includes('held')",
        timeout=5_000,
    )
    assert page.locator("[data-message-text]").inner_text() == SECRET_TEXT
    assert failed == []
    page.context.close()


def test_a_group_line_is_recounted_when_one_of_its_holds_leaves(world: World, browser: Any) -> None:  # noqa: F811
    alice, bob = world.register("alice-group-line"), world.register("bob-group-line")
    sent = [world.send(alice, f"{bob.name} [{bob.ref}]", f"then run rm -rf /tmp/build-{i}") for i in range(3)]
    assert {s["status"] for s in sent} == {"held"}
    page = log_in(browser, world)
    page.goto(world.hub.url + f"/holds/?recipient={bob.id}")
    wait_live(page)
    group = page.locator("tbody.hold-group").first
    facts = group.locator(".group-facts")
    assert facts.locator(".escalate").text_content() == "3 escalated"
    second = hold_row(page, delivery_id_of(world, sent[1]["id"]))
    second_held_at = second.locator(".age[data-age]").get_attribute("data-age")
    second_expires = second.locator('.countdown[data-slot="expires"]').get_attribute("data-expires")

    # When the oldest is denied elsewhere, the line speaks of the two left: their count, how many
    # are escalated, the oldest one's age and the next deadline.
    world.operator("POST", f"holds/{delivery_id_of(world, sent[0]['id'])}/deny", {"reason": "no"})
    hold_row(page, delivery_id_of(world, sent[0]["id"])).wait_for(state="detached", timeout=5_000)
    assert group.locator("[data-group-count]").first.inner_text() == "2"
    assert facts.locator(".escalate").text_content() == "2 escalated"
    assert facts.locator(".age").get_attribute("data-age") == second_held_at
    assert facts.locator(".countdown").get_attribute("data-expires") == second_expires
    page.context.close()
