"""Browser notifications for escalated holds, in a real headless Chromium against `switchboard
serve`: the operator opts in on the page, one notification shows for an escalated hold and none
for a routine one, it names the sessions and what matched but never the text, and clicking it
opens the hold's page, where the operator acknowledges it.

The browser's permission is granted through Playwright's context, and `window.Notification` is
wrapped by an init script so the test sees each notification the page shows."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from hub_fixtures.sensitivity_corpus import AWS_SECRET
from tests.e2e.console_world import OPERATOR, World, delivery_id_of, wait_live

pytestmark = pytest.mark.e2e

SECRET_TEXT = f"creds for the deploy: export AWS_SECRET_ACCESS_KEY={AWS_SECRET} (rotate after)"

# Records each notification the page makes (title, options) and lets the test click it.
CAPTURE = """
(() => {
  const Real = window.Notification;
  window.__notes = [];
  class Captured {
    constructor(title, options) {
      this.title = title;
      this.options = options || {};
      this.listeners = {};
      window.__notes.push(this);
    }
    addEventListener(type, fn) { this.listeners[type] = fn; }
    close() { this.closed = true; }
    static get permission() { return Real.permission; }
    static requestPermission() { return Real.requestPermission(); }
  }
  window.Notification = Captured;
})();
"""


def _notes(page: Any) -> list[dict[str, str]]:
    return page.evaluate(
        "() => window.__notes.map((n) => ({title: n.title, body: n.options.body, tag: n.options.tag}))"
    )


def _log_in_notifying(browser: Any, world: World) -> Any:  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.grant_permissions(["notifications"], origin=world.hub.url)
    context.add_init_script(CAPTURE)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(world.hub.url + "/login/")
    page.get_by_label("Username").fill(OPERATOR[0])
    page.get_by_label("Password").fill(OPERATOR[1])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(world.hub.url + "/")
    return page


def test_an_escalated_hold_notifies_an_operator_who_opted_in_and_a_routine_one_does_not(
    world: World,  # noqa: F811
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    alice, bob = world.register("alice-notify"), world.register("bob-notify")
    carol, dave = world.register("carol-notify"), world.register("dave-notify")
    world.operator("PUT", f"sessions/{dave.ref}/policy", {"policy": "hold"})
    page = _log_in_notifying(browser, world)
    wait_live(page)

    # Given the operator turns notifications on (the browser already allows them).
    toggle = page.locator("#notify-toggle")
    assert toggle.inner_text() == "Notify me"
    toggle.click()
    page.wait_for_selector('#notify-toggle[aria-pressed="true"][data-listening="on"]')
    assert toggle.inner_text() == "Notifications on"

    # When a routine hold and then an escalated one arrive,
    routine = world.send(carol, f"{dave.name} [{dave.ref}]", "please merge PR 7")
    assert routine["status"] == "held"
    sent = world.send(alice, f"{bob.name} [{bob.ref}]", SECRET_TEXT, summary="deploy creds")
    assert (sent["status"], sent["tier"]) == ("held", "sensitive")
    hold = delivery_id_of(world, sent["id"])

    # then one notification shows, for the escalated hold only (events arrive in order on the
    # socket, so the routine one was heard before it), naming who and what matched, not the text.
    page.wait_for_function("() => window.__notes.length >= 1", timeout=10_000)
    time.sleep(0.5)  # room for a wrong second notification to show
    [note] = _notes(page)
    assert note["title"] == f"Hold needs a human: {bob.name} [{bob.ref}]"
    assert note["body"] == f"{alice.name} [{alice.ref}] → {bob.name} [{bob.ref}] · AWS secret access key"
    assert note["tag"] == f"switchboard-hold-{hold}"
    assert AWS_SECRET not in str(note) and "deploy creds" not in str(note)

    # Clicking it opens the hold's page, where the operator acknowledges it.
    page.evaluate("() => window.__notes[0].listeners.click()")
    page.wait_for_url(f"{world.hub.url}/alerts/holds/{hold}/")
    assert "sensitive: AWS secret access key" in page.locator("[data-alert]").inner_text()
    page.locator("[data-acknowledge]").click()
    page.wait_for_selector("[data-acknowledgements]")
    assert f"Hold {hold} acknowledged" in page.locator(".flash").inner_text()
    shots = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS") or tmp_path)
    page.screenshot(path=str(shots / "alert-hold.png"), full_page=True)
    events = world.operator("GET", "audit?kind=alert.acknowledged&limit=100")["events"]
    assert [e["target"] for e in events] == [f"hold:{hold}"]

    # Turned off, the page shows no more.
    page.goto(world.hub.url + "/")
    wait_live(page)
    page.wait_for_selector('#notify-toggle[data-listening="on"]')  # the choice is remembered
    page.locator("#notify-toggle").click()
    page.wait_for_selector('#notify-toggle[aria-pressed="false"]:not([data-listening])')
    world.send(alice, f"{bob.name} [{bob.ref}]", SECRET_TEXT + " again")
    time.sleep(1.0)
    assert _notes(page) == []
    page.context.close()
