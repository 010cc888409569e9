"""A page on another origin of the operator's machine, attacking the console in a real headless
Chromium while the operator is logged in to a real `switchboard serve` process.

The attacker's page is served from a second loopback port (`http://127.0.0.1:<other port>/`).
Browsers keep cookies per host, not per port, so that page is "same-site" with the console: the
operator's cookies go with its requests, and its script sees every cookie of 127.0.0.1 that is not
HttpOnly. What it must not do: decide holds (CSRF), read what the hub answers the operator (CORS),
open the operator's live socket (Origin), frame the console, or read or replace the console's
cookies. (Hub, browser and log-in as in test_console_browser.py.)"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.console_world import CHROMIUM, CHROMIUM_ARGS, World, delivery_id_of, log_in

pytestmark = pytest.mark.e2e


class AttackerSite:
    """A static web server on another loopback port: the pages another local program serves."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def page(self, name: str, html: str) -> str:
        (self.folder / name).write_text(html)
        return f"{self.url}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def attacker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AttackerSite]:
    site = AttackerSite(tmp_path_factory.mktemp("attacker-site"))
    yield site
    site.close()


def _held(hub: World, sender: str, recipient: str) -> int:
    """A hold waiting for the operator: `recipient` holds everything; returns its delivery id."""
    a, b = hub.register(sender), hub.register(recipient)
    hub.operator("PUT", f"sessions/{b.ref}/policy", {"policy": "hold"})
    return delivery_id_of(hub, hub.send(a, b.ref, "approve me, please")["id"])


def _still_held(hub: World, delivery_id: int) -> bool:
    holds = hub.operator("GET", "holds")["holds"]
    return any(h["delivery_id"] == delivery_id for h in holds)


def _decide_from_the_console(page: Any, delivery_id: int) -> int:
    """Approve a hold as the holds page's script does (its form's CSRF token); returns the status."""
    return page.evaluate(
        """async (id) => {
            const token = document.querySelector('input[name="csrfmiddlewaretoken"]').value;
            const form = new URLSearchParams({delivery_ids: String(id), action: "approve", reason: ""});
            form.append("csrfmiddlewaretoken", token);
            const r = await fetch("/holds/decide", {method: "POST", credentials: "same-origin",
                headers: {Accept: "application/json", "X-CSRFToken": token}, body: form});
            return r.status;
        }""",
        delivery_id,
    )


def test_a_page_on_another_port_can_neither_read_nor_replace_the_consoles_csrf_cookie(
    world: World,  # noqa: F811
    browser: Any,  # noqa: F811
    attacker: AttackerSite,
) -> None:
    """The reported attack: the CSRF cookie was not HttpOnly, so a page on 127.0.0.1:<other port>
    read it from `document.cookie` and wrote its own over it (`csrftoken=AAAA…; path=/`); every
    approve or deny the operator then made answered 403 until the page was reloaded, and the
    attacker's tab could write it again every second while holds ran out."""
    delivery_id = _held(world, "cookie-sender", "cookie-recipient")
    console = log_in(browser, world)
    console.goto(world.hub.url + "/holds/")
    hub_cookies = {c["name"]: c["value"] for c in console.context.cookies(world.hub.url)}
    assert set(hub_cookies) >= {"csrftoken", "sessionid"}

    page = console.context.new_page()
    page.goto(attacker.page("cookies.html", "<!doctype html><title>a local dev server</title>"))
    seen = page.evaluate("document.cookie")
    page.evaluate(
        """() => {
            document.cookie = "csrftoken=" + "A".repeat(32) + "; path=/";
            document.cookie = "sessionid=attacker; path=/";
        }"""
    )

    assert hub_cookies["csrftoken"] not in seen and hub_cookies["sessionid"] not in seen, seen
    after = {c["name"]: c["value"] for c in console.context.cookies(world.hub.url) if c["path"] == "/"}
    assert after == hub_cookies
    console.bring_to_front()
    assert _decide_from_the_console(console, delivery_id) == 200
    assert not _still_held(world, delivery_id)
    console.context.close()


def test_a_page_on_another_port_cannot_act_read_or_listen_with_the_operators_login(
    world: World,  # noqa: F811
    browser: Any,  # noqa: F811
    attacker: AttackerSite,
) -> None:
    """What the cookie sent along would otherwise allow: a form post to the console (with the CSRF
    token a page could have read), a text/plain POST to the API (a "simple" request, no preflight),
    reading the API's answers, the operators' live socket, and framing the console."""
    delivery_id = _held(world, "csrf-sender", "csrf-recipient")
    console = log_in(browser, world)
    token = next(c["value"] for c in console.context.cookies(world.hub.url) if c["name"] == "csrftoken")
    page = console.context.new_page()
    answers: list[tuple[str, int]] = []
    page.on("response", lambda r: answers.append((r.url, r.status)))

    page.goto(
        attacker.page(
            "form.html",
            f"""<!doctype html><form id="f" method="post" action="{world.hub.url}/holds/decide">
            <input name="csrfmiddlewaretoken" value="{token}"><input name="delivery_ids" value="{delivery_id}">
            <input name="action" value="approve"></form><script>document.getElementById("f").submit()</script>""",
        )
    )
    page.wait_for_url(world.hub.url + "/holds/decide")
    assert (world.hub.url + "/holds/decide", 403) in answers

    page.goto(attacker.page("api.html", "<!doctype html><title>a local dev server</title>"))
    tried = page.evaluate(
        """async ([hub, id]) => {
            const out = {};
            const simple = await fetch(hub + "/api/v1/holds/decide", {method: "POST", mode: "no-cors",
                credentials: "include", headers: {"Content-Type": "text/plain"},
                body: JSON.stringify({ids: [id], approve: true})});
            out.simple = simple.type;
            try {
                const r = await fetch(hub + "/api/v1/holds", {credentials: "include"});
                out.read = await r.text();
            } catch (e) { out.read = "blocked"; }
            out.socket = await new Promise((done) => {
                const ws = new WebSocket(hub.replace("http", "ws") + "/ws/console/");
                ws.onopen = () => done("open");
                ws.onerror = () => done("refused");
                setTimeout(() => done("timeout"), 5000);
            });
            return out;
        }""",
        [world.hub.url, delivery_id],
    )
    assert tried == {"simple": "opaque", "read": "blocked", "socket": "refused"}, tried
    assert _still_held(world, delivery_id)

    framed = page.goto(
        attacker.page("frame.html", f'<!doctype html><iframe src="{world.hub.url}/holds/"></iframe>')
    )
    assert framed is not None
    page.wait_for_timeout(1000)
    child = page.frames[1] if len(page.frames) > 1 else None
    assert child is None or not child.url.startswith(world.hub.url), child and child.url
    console.context.close()


def _login_expiry(page: Any, hub: World) -> float:
    return next(c["expires"] for c in page.context.cookies(hub.hub.url) if c["name"] == "sessionid")


def _exports(hub: World) -> int:
    return len(hub.operator("GET", "audit?kind=conversation.exported&limit=500")["events"])


def test_a_page_on_another_port_can_neither_export_in_the_operators_name_nor_keep_the_login_alive(
    world: World,  # noqa: F811
    browser: Any,  # noqa: F811
    attacker: AttackerSite,
) -> None:
    """Its GETs carry the operator's cookie (same site): an `<img>` pointed at a conversation
    export downloaded it and wrote `conversation.exported` (held text included) to the audit as
    the operator's act, a link to it did the same, and any request, a favicon's, moved the
    login's idle expiry on, so a tab left open kept the console logged in."""
    a, b = world.register("export-a"), world.register("export-b")
    world.send(a, b.ref, "between us")
    export = f"{world.hub.url}/sessions/{a.id}/export?with={b.ref}&include_held=1"
    exports = _exports(world)
    console = log_in(browser, world)
    console.goto("about:blank")  # the console's own page would keep its login alive meanwhile
    before = _login_expiry(console, world)
    console.wait_for_timeout(1500)  # a refreshed expiry would now differ by a second or more
    page = console.context.new_page()
    asked: list[str] = []
    for finished in ("requestfinished", "requestfailed"):
        page.on(finished, lambda r: asked.append(r.url) if r.url.startswith(world.hub.url) else None)

    page.goto(
        attacker.page(
            "images.html",
            f'<!doctype html><img src="{export}"><img src="{world.hub.url}/favicon.ico?again">'
            f'<iframe src="{world.hub.url}/holds/"></iframe>',
        )
    )
    page.wait_for_load_state("load")
    page.wait_for_timeout(500)

    assert len(asked) == 3, asked  # the browser sent all three, with the operator's cookie
    assert _exports(world) == exports
    assert _login_expiry(console, world) == before
    with page.expect_response(lambda r: r.url.startswith(export)) as link:
        page.evaluate("(url) => { location.href = url; }", export)
    assert link.value.status == 403
    assert _exports(world) == exports

    console.bring_to_front()
    console.goto(world.hub.url + f"/sessions/{a.id}/")
    assert _login_expiry(console, world) > before
    with console.expect_download() as own:
        console.evaluate(
            "(url) => { const l = document.createElement('a'); l.href = url; l.download = ''; "
            "document.body.append(l); l.click(); }",
            export,
        )
    assert own.value.suggested_filename.startswith("switchboard-pair-export-a")
    own.value.path()  # the whole export read: it is audited once it ends
    assert _exports(world) == exports + 1
    console.context.close()


def test_a_dns_rebinding_page_reads_nothing_and_opens_no_socket(
    world: World,  # noqa: F811
    browser: Any,  # noqa: F811
) -> None:
    """A page at evil.test:<the hub's port> whose name then resolves to 127.0.0.1 is the same
    origin as what it calls, so the browser lets it read every answer and open any socket; only
    the hub's Host check stands in the way. Chromium resolves evil.test to 127.0.0.1 here, and the
    attacker's script runs in a document of that origin (the hub's own answer to it: a document
    the attacker's server sent would be from a public address, which Chromium's Local Network
    Access keeps off loopback by itself; other browsers have no such rule)."""
    port = world.hub.url.rsplit(":", 1)[1]
    evil = f"http://evil.test:{port}"
    agent = world.register("rebind-target")
    chromium = browser.browser_type.launch(  # a browser of its own: the name is mapped at launch
        executable_path=CHROMIUM,
        args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP evil.test 127.0.0.1"],
        headless=True,
    )
    try:
        page = chromium.new_page()
        page.goto(f"{evil}/")
        tried = page.evaluate(
            """async (enroll) => {
                const out = {};
                for (const path of ["/api/v1/agents", "/api/v1/federation/hub", "/login/", "/healthz"]) {
                    const r = await fetch(path);
                    const text = await r.text();
                    let reason; try { reason = JSON.parse(text).reason; } catch (e) { reason = text.slice(0, 60); }
                    out[path] = [r.status, reason];
                }
                const r = await fetch("/api/v1/sessions", {method: "POST", body: JSON.stringify({name: "x"}),
                    headers: {"Content-Type": "application/json", Authorization: "Bearer " + enroll}});
                out.register = r.status;
                for (const path of ["/ws/agent/", "/ws/console/"]) {
                    out[path] = await new Promise((done) => {
                        const ws = new WebSocket("ws://" + location.host + path);
                        ws.onopen = () => done("open");
                        ws.onerror = () => done("refused");
                        setTimeout(() => done("timeout"), 5000);
                    });
                }
                return out;
            }""",
            world.hub.enroll_key,  # what a page that had learned the key would send
        )
    finally:
        chromium.close()

    assert tried == {
        "/api/v1/agents": [400, "host"],
        "/api/v1/federation/hub": [400, "host"],
        "/login/": [400, "host"],
        "/healthz": [400, "host"],
        "register": 400,
        "/ws/agent/": "refused",
        "/ws/console/": "refused",
    }, tried
    names = [a["name"] for a in world.operator("GET", "agents")["agents"]]
    assert agent.name in names and "x" not in names
