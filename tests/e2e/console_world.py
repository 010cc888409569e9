"""What the console's browser tests share: the hub world they drive (a real `switchboard serve`,
an operator login and token, agents acting through the REST API), Debian's Chromium and its
arguments, and the steps of logging in and finding a hold on the page. The `world`, `browser` and
`shots` fixtures are in this package's conftest."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from hub_topology import REPO
from hub_topology.embedded import Hub, start_hub

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OPERATOR = ("ada", "switchboard-operator-pw")


@dataclass
class Agent:
    id: str
    name: str
    ref: str
    token: str


@dataclass
class World:
    """A running hub, an operator login, an operator token for set-up, and a REST client."""

    hub: Hub
    http: httpx.Client
    operator_token: str

    def register(self, name: str, **fields: Any) -> Agent:
        r = self.http.post(
            "/api/v1/sessions", json={"name": name, **fields}, headers=self._auth(self.hub.enroll_key)
        )
        assert r.status_code == 201, r.text
        body = r.json()
        return Agent(body["id"], body["name"], body["ref"], body["token"])

    def send(self, sender: Agent, to: str, text: str, **fields: Any) -> dict[str, Any]:
        r = self.http.post(
            "/api/v1/messages", json={"to": to, "message": text, **fields}, headers=self._auth(sender.token)
        )
        assert r.status_code == 201, r.text
        return r.json()

    def inbox(self, agent: Agent) -> list[dict[str, Any]]:
        r = self.http.get("/api/v1/inbox", headers=self._auth(agent.token))
        assert r.status_code == 200, r.text
        return r.json()["messages"]

    def status(self, message_id: str) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/messages/{message_id}", headers=self._auth(self.operator_token))
        assert r.status_code == 200, r.text
        return r.json()

    def operator(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        r = self.http.request(method, f"/api/v1/{path}", json=body, headers=self._auth(self.operator_token))
        assert r.status_code in (200, 201), r.text
        return r.json()

    def join(self, lead: Agent, team_id: str, agent: Agent) -> dict[str, Any]:
        """The lead invites `agent` and it accepts (a lead cannot add a session alone)."""
        invited = self.as_agent(lead, "POST", f"teams/{team_id}/members", {"session": agent.id})
        return self.as_agent(agent, "POST", f"teams/invitations/{invited['invitation']['id']}/accept")

    def as_agent(self, agent: Agent, method: str, path: str, body: Any = None) -> dict[str, Any]:
        r = self.http.request(method, f"/api/v1/{path}", json=body, headers=self._auth(agent.token))
        assert r.status_code in (200, 201, 202), r.text
        return r.json()

    @staticmethod
    def _auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def manage(hub: Hub, *args: str, stdin: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["SWITCHBOARD_HOME"] = str(hub.home)
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def log_in(browser: Any, world: World, *, viewport: dict[str, int] | None = None) -> Any:
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(world.hub.url + "/")
    assert "/login/" in page.url
    page.get_by_label("Username").fill(OPERATOR[0])
    page.get_by_label("Password").fill(OPERATOR[1])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(world.hub.url + "/")
    return page


def wait_live(page: Any) -> None:
    page.wait_for_selector('#live[data-state="on"]', timeout=10_000)


def hold_row(page: Any, delivery_id: int) -> Any:
    return page.locator(f'table[data-holds] tr.hold[data-delivery-id="{delivery_id}"]')


def show_hold(page: Any, delivery_id: int, timeout_ms: int = 5_000) -> Any:
    """Wait until a hold is on the holds page and visible. On an empty queue it shows at once;
    otherwise it waits behind the "N new" button (rows never move by themselves), which this
    clicks; a collapsed group is opened. Returns the row."""
    row = hold_row(page, delivery_id)
    page.wait_for_function(
        """(id) => document.querySelector('table[data-holds] tr.hold[data-delivery-id="' + id + '"]')
                 || !document.querySelector('[data-new-holds]').hidden""",
        arg=str(delivery_id),
        timeout=timeout_ms,
    )
    if not row.count():
        # The queue may empty meanwhile, and an empty queue shows new holds by itself.
        with contextlib.suppress(PlaywrightTimeout):
            page.locator("[data-new-holds]").click(timeout=2_000)
        row.wait_for(state="attached", timeout=timeout_ms)
    group = page.locator(f'tbody.hold-group:has(tr.hold[data-delivery-id="{delivery_id}"])')
    if group.get_attribute("data-collapsed") is not None:
        group.locator("[data-group-toggle]").click()
    row.wait_for(state="visible", timeout=timeout_ms)
    return row


def delivery_id_of(world: World, message_id: str) -> int:
    return world.status(message_id)["deliveries"][0]["delivery_id"]


def holds_page(world: World, browser: Any, sender: str, recipient: str) -> tuple[Any, Agent, Agent, str]:
    """Register `sender` and `recipient`, give the recipient the operator policy `hold`, and open
    the holds queue (live). Returns the page, both agents and the address that reaches the recipient."""
    a, b = world.register(sender), world.register(recipient)
    world.operator("PUT", f"sessions/{b.ref}/policy", {"policy": "hold"})
    page = log_in(browser, world)
    page.goto(world.hub.url + "/holds/")
    wait_live(page)
    return page, a, b, f"{b.name} [{b.ref}]"


@contextlib.contextmanager
def world_running(folder: Path, extra_env: dict[str, str] | None = None) -> Iterator[World]:
    """A hub started in `folder`/home (`extra_env` its settings) with the operator's login and a
    set-up token; stopped afterwards."""
    home = folder / "home"
    home.mkdir(mode=0o700)
    hub = start_hub(home, extra_env=extra_env)
    try:
        manage(hub, "operator_create", OPERATOR[0], "--password-stdin", stdin=OPERATOR[1] + "\n")
        token = manage(hub, "operator_token", "e2e-setup").strip().splitlines()[-1]
        with httpx.Client(base_url=hub.url, timeout=15) as http:
            yield World(hub=hub, http=http, operator_token=token)
    finally:
        hub.stop()
