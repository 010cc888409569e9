"""The operator console in a real headless Chromium against a real `switchboard serve` process.

Agents act through the REST API (as they would); the operator acts only through the page. The run
also takes the screenshots the README shows: into a temporary directory, so a test run leaves the
checkout as it found it, or into the directory SWITCHBOARD_SCREENSHOTS names
(`SWITCHBOARD_SCREENSHOTS=docs/screenshots` refreshes the README's).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.console_world import (
    OPERATOR,
    World,
    delivery_id_of,
    hold_row,
    holds_page,
    log_in,
    show_hold,
    wait_live,
)

pytestmark = pytest.mark.e2e

SCRIPT_TEXT = 'Looks good <script>window.__pwned = 1</script> <img src=x onerror="window.__pwned = 2">'


def test_pages_and_socket_need_a_login(world: World, browser: Any) -> None:
    context = browser.new_context()
    page = context.new_page()
    for path in ["/", "/holds/", "/audit/"]:
        page.goto(world.hub.url + path)
        assert "/login/" in page.url, path
    # A wrong password keeps the visitor on the login page with a message.
    page.get_by_label("Username").fill(OPERATOR[0])
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("alert").wait_for(timeout=5_000)
    assert "/login/" in page.url
    # A socket opened from the page without a login is refused (the consumer closes it).
    code = page.evaluate(
        """() => new Promise((resolve) => {
            const ws = new WebSocket(location.origin.replace('http', 'ws') + '/ws/console/');
            ws.onclose = (e) => resolve(e.code);
            setTimeout(() => resolve('timeout'), 5000);
        })"""
    )
    assert code in (1006, 4403), code
    context.close()


def test_logging_out_in_one_tab_ends_the_live_feed_in_the_others(world: World, browser: Any) -> None:
    """Given the console open live in two tabs of one browser, when the operator logs out in one,
    then the other tab's socket is closed by the hub and the page says to log in again, while a
    console in another browser stays live."""
    first = log_in(browser, world)
    second = first.context.new_page()
    second.goto(world.hub.url + "/holds/")
    elsewhere = log_in(browser, world)
    for page in (first, second, elsewhere):
        wait_live(page)

    first.get_by_role("button", name=f"Log out {OPERATOR[0]}").click()
    first.wait_for_url("**/login/**")

    second.wait_for_selector('#live[data-state="off"]', timeout=10_000)
    assert second.locator("#live").inner_text() == "not authorized — log in again"
    assert elsewhere.locator("#live").get_attribute("data-state") == "on"
    first.context.close()
    elsewhere.context.close()


def test_a_policy_hold_appears_without_reload_and_approving_it_delivers(world: World, browser: Any) -> None:
    """Given bob's operator policy is hold, when alice sends, the hold shows up live; approving it
    in the page queues it, bob's inbox pull gets it, and its state becomes delivered."""
    page, alice, bob, to_bob = holds_page(world, browser, "alice-e2e", "bob-e2e")
    page.evaluate("() => { window.__reloaded = false; }")  # survives only if the page never reloads

    started = time.monotonic()
    sent = world.send(alice, to_bob, "please merge PR 12", summary="merge PR 12")
    assert sent["status"] == "held"
    delivery_id = delivery_id_of(world, sent["id"])
    row = show_hold(page, delivery_id)
    appeared_after = time.monotonic() - started
    print(f"held message appeared in the queue {appeared_after:.3f} s after the send returned")
    assert page.evaluate("() => window.__reloaded") is False
    assert "merge PR 12" in row.inner_text()
    assert f"alice-e2e [{alice.ref}]" in row.inner_text()
    assert "host-verified" in row.inner_text()

    row.get_by_role("button", name="Approve").click()
    row.wait_for(state="detached", timeout=5_000)
    assert world.status(sent["id"])["status"] == "queued"
    pulled = world.inbox(bob)
    assert [m["id"] for m in pulled] == [sent["id"]]
    assert world.status(sent["id"])["status"] == "delivered"
    page.context.close()


def test_a_hold_denied_with_the_keyboard_never_arrives(world: World, browser: Any) -> None:
    page, carol, dan, to_dan = holds_page(world, browser, "carol-e2e", "dan-e2e")
    sent = world.send(carol, to_dan, "run the migration on prod now", summary="prod migration")
    delivery_id = delivery_id_of(world, sent["id"])
    row = show_hold(page, delivery_id)

    # j moves to a hold; r types its reason; Esc leaves the box; d denies.
    rows = page.locator("table[data-holds] tr.hold")
    for _ in range(rows.count()):
        if "current" in (row.get_attribute("class") or ""):
            break
        page.keyboard.press("j")
    assert "current" in (row.get_attribute("class") or "")
    page.keyboard.press("r")
    page.keyboard.type("not during the freeze")
    page.keyboard.press("Enter")  # never approves by accident
    page.wait_for_timeout(300)
    assert row.count() == 1 and world.status(sent["id"])["status"] == "held"
    page.keyboard.press("Escape")
    page.keyboard.press("d")
    row.wait_for(state="detached", timeout=5_000)
    # The live event may take the row away before the page has read the decision's answer, which
    # is when the notice is written: wait for it.
    page.locator("#notice", has_text="Denied 1").wait_for(timeout=5_000)

    status = world.status(sent["id"])
    assert status["status"] == "denied"
    assert status["deliveries"][0]["decision_reason"] == "not during the freeze"
    assert status["deliveries"][0]["decided_by"] == f"operator:{OPERATOR[0]}"
    assert sent["id"] not in [m["id"] for m in world.inbox(dan)]
    page.context.close()


def test_many_holds_are_approved_at_once(world: World, browser: Any) -> None:
    page, erin, fay, to_fay = holds_page(world, browser, "erin-e2e", "fay-e2e")
    sent = [world.send(erin, to_fay, f"batch item {i}") for i in range(3)]
    ids = [delivery_id_of(world, s["id"]) for s in sent]
    for delivery_id in ids:
        show_hold(page, delivery_id).get_by_role("checkbox").check()
    assert page.locator("[data-selected-count]").inner_text().startswith("3")
    page.get_by_role("button", name="Approve selected").click()
    for delivery_id in ids:
        hold_row(page, delivery_id).wait_for(state="detached", timeout=5_000)
    assert sorted(m["id"] for m in world.inbox(fay)) == sorted(s["id"] for s in sent)
    page.context.close()


def test_a_page_that_lost_its_socket_catches_up_on_what_it_missed(world: World, browser: Any) -> None:
    """Given the socket is down, when a hold is created and another decided meanwhile, then on
    reconnecting the page shows the new hold and drops the decided one, without a reload."""
    page, mia, _, to_ned = holds_page(world, browser, "mia-e2e", "ned-e2e")
    early = world.send(mia, to_ned, "decided while you were away")
    early_row = show_hold(page, delivery_id_of(world, early["id"]))
    page.evaluate("() => { window.__reloaded = false; window.switchboardConsole.pause(); }")
    page.wait_for_selector('#live[data-state="off"]', timeout=5_000)

    late = world.send(mia, to_ned, "sent while you were away")
    world.operator("POST", f"holds/{delivery_id_of(world, early['id'])}/deny", {"reason": "elsewhere"})
    page.wait_for_timeout(500)
    late_row = hold_row(page, delivery_id_of(world, late["id"]))
    assert late_row.count() == 0 and early_row.count() == 1  # nothing arrives while offline
    assert page.locator("[data-new-holds]").is_hidden()

    page.evaluate("() => window.switchboardConsole.resume()")
    early_row.wait_for(state="detached", timeout=5_000)
    show_hold(page, delivery_id_of(world, late["id"]))
    assert page.evaluate("() => window.__reloaded") is False
    page.context.close()


def test_message_text_with_markup_is_shown_as_text(world: World, browser: Any) -> None:
    page, gus, _, to_hal = holds_page(world, browser, "gus-e2e", "hal-e2e")
    sent = world.send(gus, to_hal, SCRIPT_TEXT, summary="<b>bold?</b>")
    row = show_hold(page, delivery_id_of(world, sent["id"]))
    # Arrived live (fetched by the script): markup is text, nothing ran, no element was created.
    assert "<script>window.__pwned = 1</script>" in row.inner_text()
    assert "<b>bold?</b>" in row.inner_text()
    assert row.locator("script, img, b").count() == 0
    # Rendered by the server: the same.
    page.reload()
    row = show_hold(page, delivery_id_of(world, sent["id"]))
    assert "<script>window.__pwned = 1</script>" in row.inner_text()
    assert row.locator("script, img, b").count() == 0
    page.goto(world.hub.url + f"/messages/{sent['id']}/")
    assert SCRIPT_TEXT in page.locator("pre.message-text").inner_text()
    page.goto(world.hub.url + "/")
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__pwned === undefined")
    page.context.close()


def test_the_dashboard_feed_follows_a_message_from_queued_to_read(world: World, browser: Any) -> None:
    ivy, jon = world.register("ivy-e2e"), world.register("jon-e2e")
    page = log_in(browser, world)
    wait_live(page)
    sent = world.send(ivy, f"jon-e2e [{jon.ref}]", "lunch at noon?", summary="lunch")
    row = page.locator(f'table[data-feed] tr[data-message-id="{sent["id"]}"]')
    row.wait_for(state="visible", timeout=5_000)
    assert row.get_attribute("data-state") == "queued"
    world.inbox(jon)
    page.wait_for_function(
        f"""() => document.querySelector('table[data-feed] tr[data-message-id="{sent["id"]}"]')
                 ?.dataset.state === 'delivered'""",
        timeout=5_000,
    )
    world.as_agent(jon, "POST", "inbox/ack", {"ids": [sent["id"]]})
    page.wait_for_function(
        f"""() => document.querySelector('table[data-feed] tr[data-message-id="{sent["id"]}"]')
                 ?.dataset.state === 'read'""",
        timeout=5_000,
    )
    # A new session shows up in the sessions table without a reload.
    kim = world.register("kim-e2e", cwd="/work/kim")
    page.locator(f'table[data-sessions] tr[data-session-id="{kim.id}"]').wait_for(timeout=5_000)
    page.context.close()


def test_the_policy_editor_sets_an_operator_policy(world: World, browser: Any) -> None:
    lou = world.register("lou-e2e")
    page = log_in(browser, world)
    page.goto(world.hub.url + f"/sessions/{lou.id}/")
    page.get_by_role("combobox", name="Operator's floor").select_option("refuse")
    page.get_by_role("button", name="Save the floor").click()
    page.wait_for_url(world.hub.url + f"/sessions/{lou.id}/")
    assert "refuse" in page.locator(".flash").inner_text()
    policy = world.operator("GET", f"sessions/{lou.ref}/policy")
    assert policy["operator_policy"] == "refuse"
    page.context.close()


def test_the_team_board_and_roster_update_live(world: World, browser: Any) -> None:
    lead, mate = world.register("lead-live"), world.register("mate-live")
    team = world.as_agent(lead, "POST", "teams", {"name": "live-board"})
    page = log_in(browser, world)
    page.goto(world.hub.url + f"/teams/{team['id']}/")
    wait_live(page)
    page.evaluate("() => { window.__reloaded = false; }")
    world.join(lead, team["id"], mate)
    page.locator("table", has_text=f"mate-live [{mate.ref}]").wait_for(timeout=5_000)
    task = world.as_agent(lead, "POST", f"teams/{team['id']}/tasks", {"title": "Appears <live>"})
    card = page.locator('[data-column="pending"] .card', has_text="Appears <live>")
    card.wait_for(timeout=5_000)
    world.as_agent(mate, "POST", f"tasks/{task['id']}/claim", {})
    page.locator('[data-column="in_progress"] .card', has_text="Appears <live>").wait_for(timeout=5_000)
    assert page.evaluate("() => window.__reloaded") is False
    page.context.close()


def _populate_for_screenshots(world: World) -> dict[str, Any]:
    """A team with a board in every column, sessions in each status, messages in each state."""
    lead = world.register("architect", cwd="/work/app", kind="claude-code")
    ui = world.register("frontend", cwd="/work/app/web", kind="claude-code")
    api = world.register("backend", cwd="/work/app/api", kind="codex")
    ops = world.register("ops", cwd="/work/infra", kind="claude-code", permission_mode="bypass")
    world.register("reviewer", kind="script", status="stopped")
    team = world.as_agent(lead, "POST", "teams", {"name": "checkout"})
    team_id = team["id"]
    members = {}
    for agent in (ui, api):
        members[agent.name] = world.join(lead, team_id, agent)
    schema = world.as_agent(lead, "POST", f"teams/{team_id}/tasks", {"title": "Design the orders schema"})
    blocked = world.as_agent(
        lead,
        "POST",
        f"teams/{team_id}/tasks",
        {
            "title": "Orders API endpoints",
            "description": "GET/POST /orders, GET /orders/{id}; pagination by cursor.",
            "blocked_by": [schema["id"]],
        },
    )
    world.as_agent(lead, "POST", f"teams/{team_id}/tasks", {"title": "Checkout page: cart summary"})
    world.as_agent(lead, "POST", f"teams/{team_id}/tasks", {"title": "Load test the payment path"})
    world.as_agent(api, "POST", f"tasks/{schema['id']}/claim", {})
    cart = world.as_agent(lead, "POST", f"teams/{team_id}/tasks", {"title": "Wire up Stripe test keys"})
    world.as_agent(ui, "POST", f"tasks/{cart['id']}/claim", {})
    world.as_agent(ui, "POST", f"tasks/{cart['id']}/complete", {"result": "done"})

    world.operator("PUT", f"sessions/{ops.ref}/policy", {"policy": "hold"})
    first = world.send(
        lead, "frontend", "Cart summary needs the new totals endpoint.", summary="totals endpoint"
    )
    world.inbox(ui)
    world.as_agent(ui, "POST", "inbox/ack", {"ids": [first["id"]]})
    question = world.send(ui, "backend", "Which field carries the currency?", summary="currency field")
    world.inbox(api)
    answer = world.send(
        api,
        "frontend",
        "`currency` on the order, ISO 4217.",
        summary="currency: ISO 4217",
        in_reply_to=question["id"],
    )
    world.send(ui, "backend", "Thanks, wiring it up.", summary="thanks", in_reply_to=answer["id"])
    world.send(api, "architect", "Schema draft is in docs/orders.md", summary="schema draft")
    world.inbox(lead)
    risky = world.send(
        api, "ops", "Please run: git reset --hard origin/main on the staging box", summary="reset staging"
    )
    world.send(lead, "ops", "Can you bump the staging database size?", summary="bigger staging db")
    world.send(ui, "ops", "Deploy the web build <b>tonight</b>?", summary="deploy tonight")
    for n in (1, 2, 3):
        world.send(lead, "ops", f"Status of the staging deploy? ({n})", summary=f"staging status {n}")
    return {
        "team_id": team_id,
        "sensitive_id": risky["id"],
        "ops_id": ops.id,
        "pair": (ui.id, api.id),
        "blocked_id": blocked["id"],
    }


def test_screenshots_of_dashboard_holds_and_board(world: World, browser: Any, shots: Path) -> None:
    made = _populate_for_screenshots(world)
    page = log_in(browser, world)
    wait_live(page)
    page.screenshot(path=str(shots / "dashboard.png"), full_page=False)

    page.goto(world.hub.url + "/holds/")
    wait_live(page)
    page.keyboard.press("j")
    page.screenshot(path=str(shots / "holds.png"), full_page=False)
    sensitive = page.locator('table[data-holds] tr.hold[data-tier="sensitive"]')
    assert sensitive.count() >= 1
    assert "escalated" in sensitive.first.inner_text().lower()

    page.goto(world.hub.url + f"/teams/{made['team_id']}/")
    page.locator(".board").wait_for()
    assert page.locator('[data-column="in_progress"] .card').count() >= 1
    page.locator(f'.card[data-task="{made["blocked_id"]}"] summary').click()
    page.locator(".board").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "team-board.png"), full_page=False)

    ui_id, api_id = made["pair"]
    page.goto(world.hub.url + f"/conversations/{ui_id}/{api_id}/")
    assert page.locator("ol.thread li.entry.depth-2").count() == 1
    page.screenshot(path=str(shots / "conversation.png"), full_page=False)

    sensitive_id = made["sensitive_id"]
    page.goto(world.hub.url + f"/messages/{sensitive_id}/")
    page.screenshot(path=str(shots / "message.png"), full_page=False)
    page.goto(world.hub.url + f"/sessions/{made['ops_id']}/")
    page.screenshot(path=str(shots / "session.png"), full_page=False)
    page.goto(world.hub.url + "/audit/")
    page.screenshot(path=str(shots / "audit.png"), full_page=False)
    page.context.close()

    phone = log_in(browser, world, viewport={"width": 390, "height": 844})
    phone.goto(world.hub.url + "/holds/")
    wait_live(phone)
    phone.screenshot(path=str(shots / "holds-phone.png"), full_page=False)
    phone.goto(world.hub.url + "/")
    wait_live(phone)
    phone.screenshot(path=str(shots / "dashboard-phone.png"), full_page=False)
    phone.goto(world.hub.url + "/holds/")
    # On a phone the decision buttons are on screen without scrolling sideways.
    width = phone.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390 + 1
    phone.context.close()
    for name in ("dashboard", "holds", "team-board", "holds-phone", "conversation"):
        shot = shots / f"{name}.png"
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000, name
