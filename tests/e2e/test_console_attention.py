"""The console's attention strip, grouped holds, conversations and small page fixes in a real
headless Chromium against a real `switchboard serve` process (agents act through the REST API, the
operator only through the page). This hub calls a session dead after DEAD_AFTER seconds of
silence, so the strip's dead figure can be seen within a test. Screenshots go where
SWITCHBOARD_SCREENSHOTS says (see test_console_browser.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hub_fixtures.sensitivity_corpus import AWS_SECRET
from tests.e2e.console_world import (
    World,
    delivery_id_of,
    hold_row,
    log_in,
    show_hold,
    wait_live,
    world_running,
)

pytestmark = pytest.mark.e2e

DEAD_AFTER = 3
SECRET_TEXT = f"creds for the deploy: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} (rotate after)"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("console-attention")
    with world_running(folder, extra_env={"SWITCHBOARD_DEAD_AFTER_SECONDS": str(DEAD_AFTER)}) as running:
        yield running


def _strip(page: Any, name: str) -> Any:
    return page.locator(f'[data-attention-strip] [data-attention="{name}"]')


def _wait_count(page: Any, name: str, n: int) -> None:
    page.wait_for_function(
        """([name, n]) => document.querySelector('[data-attention-strip] [data-attention="' + name + '"]')
                 ?.dataset.count === String(n)""",
        arg=[name, n],
        timeout=10_000,
    )


def _holding(world: World, recipient: str) -> Any:
    """A session whose operator floor is hold."""
    agent = world.register(recipient)
    world.operator("PUT", f"sessions/{agent.ref}/policy", {"policy": "hold"})
    return agent


def test_the_attention_strip_follows_holds_and_dead_agents_live(world: World, browser: Any) -> None:  # noqa: F811
    """Given an operator on the audit page, when holds arrive (one escalated) and a session goes
    silent, the strip's figures change without a reload, and each figure links where it says."""
    page = log_in(browser, world)
    page.goto(world.hub.url + "/audit/")
    wait_live(page)
    page.evaluate("() => { window.__reloaded = false; }")
    for name in ("held", "escalated", "dead"):
        assert _strip(page, name).get_attribute("data-count") == "0"

    alice, bob = world.register("alice-att"), _holding(world, "bob-att")
    world.send(alice, f"{bob.name} [{bob.ref}]", "please deploy", summary="deploy")
    _wait_count(page, "held", 1)
    world.send(alice, f"{bob.name} [{bob.ref}]", SECRET_TEXT, summary="creds")
    _wait_count(page, "held", 2)
    _wait_count(page, "escalated", 1)
    assert "next expiry" in _strip(page, "next-expiry").inner_text()
    assert _strip(page, "next-expiry").locator(".countdown").inner_text().endswith("s")

    # carol says nothing for longer than DEAD_AFTER; the next session event refreshes the strip.
    carol = world.register("carol-att")
    time.sleep(DEAD_AFTER + 1)
    world.as_agent(alice, "POST", "sessions/me/heartbeat")
    world.as_agent(bob, "POST", "sessions/me/heartbeat")
    world.register("dave-att")  # a session event: the page asks the server for the figures again
    # At least carol; on a slow machine the others may have gone silent too by now.
    page.wait_for_function(
        """() => Number(document.querySelector('[data-attention-strip] [data-attention="dead"]')
                 ?.dataset.count) >= 1""",
        timeout=10_000,
    )
    assert page.evaluate("() => window.__reloaded") is False

    _strip(page, "dead").click()
    page.wait_for_url("**/?liveness=dead")
    rows = page.locator("table[data-sessions] tbody tr[data-session-id]")
    statuses = rows.evaluate_all("rows => rows.map(r => [r.dataset.sessionId, r.dataset.status])")
    assert [carol.id, "dead"] in statuses and {s for _, s in statuses} == {"dead"}

    _strip(page, "escalated").click()
    page.wait_for_url("**/holds/?escalated=1")
    assert page.locator("table[data-holds] tr.hold").count() == 1
    assert page.locator('table[data-holds] tr.hold[data-escalate="required"]').count() == 1
    page.context.close()


def test_holds_group_by_pair_wait_behind_a_pill_and_take_one_decision(world: World, browser: Any) -> None:  # noqa: F811
    """Given a queue with one hold under the pointer, when three more arrive from one sender, no
    row moves; the "3 new" button shows them as one group, and one click approves the group."""
    ann, erin, fay = world.register("ann-att"), world.register("erin-att"), _holding(world, "fay-att")
    to_fay = f"{fay.name} [{fay.ref}]"
    first = world.send(ann, to_fay, "first, on its own", summary="first")
    page = log_in(browser, world)
    page.goto(world.hub.url + "/holds/")
    wait_live(page)
    row = show_hold(page, delivery_id_of(world, first["id"]))
    row.hover()
    top = row.bounding_box()["y"]

    loop = [world.send(erin, to_fay, f"loop message {i}") for i in range(3)]
    pill = page.locator("[data-new-holds]")
    page.wait_for_function(
        "() => document.querySelector('[data-new-holds] [data-slot=\"new-count\"]')?.textContent === '3'",
        timeout=10_000,
    )
    assert pill.is_visible() and "3 new" in pill.inner_text()
    assert row.bounding_box()["y"] == top  # nothing moved under the pointer
    for sent in loop:
        assert hold_row(page, delivery_id_of(world, sent["id"])).count() == 0

    pill.click()
    pill.wait_for(state="hidden")
    ids = [delivery_id_of(world, s["id"]) for s in loop]
    group = page.locator(f'tbody.hold-group:has(tr.hold[data-delivery-id="{ids[0]}"])')
    group.wait_for()
    assert group.get_attribute("data-collapsed") is not None  # one line for the three
    assert "3 held" in group.locator("tr.group-head").inner_text()
    assert "held for" in group.locator("tr.group-head").inner_text()
    group.get_by_role("button", name="Approve all 3").click()
    group.wait_for(state="detached", timeout=5_000)
    assert {world.status(s["id"])["status"] for s in loop} == {"queued"}
    assert row.is_visible() and world.status(first["id"])["status"] == "held"

    # An escalated group takes a reason, as an escalated hold does.
    secrets = [world.send(erin, to_fay, SECRET_TEXT + f" #{i}") for i in range(2)]
    sid = delivery_id_of(world, secrets[0]["id"])
    show_hold(page, sid)
    escalated = page.locator(f'tbody.hold-group:has(tr.hold[data-delivery-id="{sid}"])')
    escalated.get_by_role("button", name="Approve all 2").click()
    page.wait_for_selector('#notice[data-kind="error"]', timeout=5_000)
    assert "takes a reason" in page.locator("#notice").inner_text()
    escalated.locator("tr.group-head input[name=reason]").fill("checked: test keys")
    escalated.get_by_role("button", name="Approve all 2").click()
    escalated.wait_for(state="detached", timeout=5_000)
    assert {world.status(s["id"])["status"] for s in secrets} == {"queued"}

    # The age and expiry columns sort.
    page.get_by_role("link", name="Expires in").click()
    page.wait_for_url("**/holds/?sort=expires")
    assert page.locator('th[aria-sort="ascending"]').text_content().startswith("Expires in")
    assert page.locator("tr.hold .age").first.inner_text().endswith("s")
    page.context.close()


def test_a_conversation_is_threaded_reachable_and_exportable(world: World, browser: Any) -> None:  # noqa: F811
    """A pair's conversation shows replies under what they answer, decisions inline and secrets
    masked; it is reached from the session, message and holds pages and links its export."""
    gus, hal = world.register("gus-att"), _holding(world, "hal-att")
    ask = world.send(gus, f"hal-att [{hal.ref}]", "shall I merge PR 7?", summary="merge PR 7?")
    world.operator("POST", f"holds/{delivery_id_of(world, ask['id'])}/approve", {"reason": "fine by me"})
    world.operator("PUT", f"sessions/{hal.ref}/policy", {"policy": None})
    answer = world.send(hal, f"gus-att [{gus.ref}]", "yes, merge it", in_reply_to=ask["id"])
    world.send(gus, f"hal-att [{hal.ref}]", SECRET_TEXT, summary="the key")

    page = log_in(browser, world)
    page.goto(world.hub.url + f"/sessions/{gus.id}/")
    page.get_by_role("link", name=f"with hal-att [{hal.ref}]").click()
    page.wait_for_url(f"**/conversations/{gus.id}/{hal.id}/")
    entries = page.locator("ol.thread > li.entry")
    assert entries.count() == 3
    reply = page.locator(f'li.entry[data-message-id="{answer["id"]}"]')
    assert "depth-1" in (reply.get_attribute("class") or "")
    assert "Approved by operator:e2e-setup: “fine by me”" in page.locator("ol.thread").inner_text()
    assert "Held for hal-att because sensitive." in page.locator("ol.thread").inner_text()
    assert AWS_SECRET not in page.content() and f"[AWS secret access key {AWS_SECRET[:4]}" in page.content()
    with page.expect_download() as download:
        page.locator("[data-export-link]").click()
    assert "merge PR 7?" in Path(download.value.path()).read_text()

    page.goto(world.hub.url + f"/messages/{ask['id']}/")
    page.locator("[data-conversation-link]").click()
    page.wait_for_url(f"**/conversations/{gus.id}/{hal.id}/")
    page.goto(world.hub.url + "/holds/")
    page.locator('a[data-link="conversation"]').first.click()
    page.wait_for_url("**/conversations/**")
    page.context.close()


def test_the_feed_filters_and_dates_its_times_and_the_small_things_read_right(
    world: World,
    browser: Any,  # noqa: F811
    shots: Path,  # noqa: F811
) -> None:
    ivy, jon = world.register("ivy-att"), world.register("jon-att")
    lead = world.register("lead-att")
    team = world.as_agent(lead, "POST", "teams", {"name": "att-board"})
    schema = world.as_agent(
        lead,
        "POST",
        f"teams/{team['id']}/tasks",
        {"title": "Orders schema", "description": "tables and keys"},
    )
    world.as_agent(
        lead, "POST", f"teams/{team['id']}/tasks", {"title": "Orders API", "blocked_by": [schema["id"]]}
    )

    page = log_in(browser, world)
    page.get_by_label("State").select_option("held")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/?state=held*")
    wait_live(page)
    feed = page.locator("table[data-feed] tbody tr[data-delivery-id]")
    assert feed.count() >= 1
    assert set(feed.evaluate_all("rows => rows.map(r => r.dataset.state)")) == {"held"}
    assert page.locator("table[data-feed] time").first.inner_text()[:4].isdigit()  # 2026-… HH:MM:SS
    # Live: a queued message stays out of the held feed; a held one comes in.
    queued = world.send(ivy, f"jon-att [{jon.ref}]", "not held", summary="not held")
    kit = _holding(world, "kit-att")
    held = world.send(ivy, f"kit-att [{kit.ref}]", "held one", summary="held one")
    page.locator(f'table[data-feed] tr[data-message-id="{held["id"]}"]').wait_for(timeout=5_000)
    assert page.locator(f'table[data-feed] tr[data-message-id="{queued["id"]}"]').count() == 0

    # The message page is headed by its summary and words its hold.
    page.goto(world.hub.url + f"/messages/{held['id']}/")
    assert page.locator("h1").inner_text() == "held one"
    assert page.locator("[data-held-because]").inner_text() == "operator's floor for the recipient: hold"

    # The session page tells the floor from the session's own policy and shows the hold expiry.
    world.as_agent(jon, "PUT", f"sessions/{jon.ref}/policy", {"policy": "hold"})
    page.goto(world.hub.url + f"/sessions/{jon.id}/")
    assert page.locator("[data-operator-floor]").inner_text().startswith("none set")
    assert page.locator("[data-own-policy]").inner_text() == "hold (set by the session)"
    # The expiry field holds only the session's own setting; the hub's default shows beside it.
    expiry = page.get_by_label("Holds expire after (seconds)")
    assert expiry.input_value() == "" and expiry.get_attribute("placeholder") == "the hub's default, 300"
    assert page.locator("[data-hold-expiry]").inner_text() == "300 s (the hub's default)"

    # Blocked tasks say so; a card opens to its details.
    page.goto(world.hub.url + f"/teams/{team['id']}/")
    blocked = page.locator(".card.blocked")
    assert blocked.count() == 1 and blocked.locator(".blocked-badge").text_content() == "Blocked"
    assert f"waiting on #{schema['id']} Orders schema" in blocked.inner_text()
    card = page.locator(f'.card[data-task="{schema["id"]}"]')
    assert not card.locator(".card-facts").is_visible()
    card.locator("summary").click()
    assert card.locator(".card-facts").is_visible() and "tables and keys" in card.inner_text()
    page.context.close()


def test_holds_arriving_while_the_queue_is_fetched_are_all_shown(world: World, browser: Any) -> None:  # noqa: F811
    """Given the page's fetch of an empty queue is slow, when another hold arrives meanwhile, it
    is not lost between two answers: the page fetches again once the first answer is in."""
    yan, zed = world.register("yan-att"), _holding(world, "zed-att")
    to_zed = f"{zed.name} [{zed.ref}]"
    page = log_in(browser, world)
    url = world.hub.url + f"/holds/?recipient={zed.id}"
    page.goto(url)
    wait_live(page)
    held_back: list[tuple[Any, Any]] = []
    releasing: list[bool] = []

    def slow_fetches(route: Any) -> None:
        # The script asks with Accept: text/html; its answers are kept back, as read now, until
        # the test releases them in the order asked.
        if route.request.headers.get("accept") == "text/html" and not releasing:
            held_back.append((route, route.fetch()))
        else:
            route.continue_()

    page.route(url, slow_fetches)
    first = world.send(yan, to_zed, "first on an empty queue")
    for _ in range(200):
        if held_back:
            break
        page.wait_for_timeout(25)
    assert held_back, "the page did not fetch the queue for a hold on an empty queue"
    second = world.send(yan, to_zed, "while the queue is fetched")
    page.wait_for_timeout(500)  # the page has heard of it (its socket is live)
    releasing.append(True)
    for route, answer in list(held_back):  # in the order asked
        route.fulfill(response=answer)
        page.wait_for_timeout(200)
    for message in (first, second):
        show_hold(page, delivery_id_of(world, message["id"]))
    page.context.close()
