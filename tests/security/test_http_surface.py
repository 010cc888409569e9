"""Attacks on the hub's HTTP surface (issue 30, items 6 to 10), each reproduced against the hub's
ASGI application (or a real server process) and refused:

- a DNS-rebinding page reaching the API under a foreign Host name;
- bodies that would have been read whole before any check (chunked, or declared too large),
  uploads read into memory, uploads without bound, files nobody uses kept for ever;
- a POST without a token answered as a CSRF failure instead of a 401; a cookie POST without CSRF;
- a page on another local port opening the operator's or an agent's WebSocket;
- the API docs loading scripts from a CDN.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from hub.asgi import application
from messaging.models import Message
from messaging.services.sessions import session_register

HUB = "127.0.0.1:8765"
UNAUTHORIZED_HINT = "Send a valid token as `Authorization: Bearer <token>`."


def hub_client(host: str = HUB) -> httpx.AsyncClient:
    """An HTTP client talking to the hub's ASGI application (the same one daphne serves)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url=f"http://{host}")


@sync_to_async
def new_token(name: str) -> str:
    return session_register(name=name).token


@sync_to_async
def message_count() -> int:
    return Message.objects.count()


# --- item 6: ALLOWED_HOSTS on every path --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_foreign_host_name_is_refused_on_the_api() -> None:
    """A DNS-rebinding page talks to 127.0.0.1 under its own name: the API must not answer it."""
    token = await new_token("alice")
    async with hub_client() as http:
        ours = await http.get("/api/v1/ping", headers={"Authorization": f"Bearer {token}"})
        theirs = await http.get(
            "/api/v1/ping", headers={"Authorization": f"Bearer {token}", "Host": "evil.example"}
        )
        docs = await http.get("/api/docs", headers={"Host": "evil.example"})
    assert ours.status_code == 200
    assert theirs.status_code == 400 and theirs.json()["reason"] == "host"
    assert docs.status_code == 400


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_foreign_host_name_is_refused_on_the_send_route() -> None:
    token = await new_token("alice")
    await new_token("bob")
    async with hub_client() as http:
        sent = await http.post(
            "/api/v1/messages",
            json={"to": "bob", "message": "rebound"},
            headers={"Authorization": f"Bearer {token}", "Host": "evil.example:8765"},
        )
    assert sent.status_code == 400
    assert await message_count() == 0


# --- item 8: 401 without a token, CSRF only for cookies -------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("authorization", [None, "Bearer not-a-token"])
@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/api/v1/messages", {"to": "bob", "message": "hi"}),
        ("POST", "/api/v1/holds/decide", {"ids": [1], "approve": True}),
        ("PATCH", "/api/v1/sessions/me", {"status": "idle"}),
        ("GET", "/api/v1/inbox", None),
    ],
)
async def test_without_a_valid_token_every_method_gets_401_with_the_hint(
    authorization: str | None, method: str, path: str, body: Any
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with hub_client() as http:
        answer = await http.request(method, path, json=body, headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.json() == {"error": "unauthorized", "detail": UNAUTHORIZED_HINT}


@pytest.mark.django_db
def test_a_cookie_authenticated_post_without_its_csrf_token_is_refused() -> None:
    """The operator's browser sends its session cookie on its own: CSRF still guards it."""
    user = get_user_model().objects.create_user("ops", password="pw-for-tests-only", is_staff=True)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    refused = browser.post(
        "/api/v1/holds/decide", data={"ids": [1], "approve": True}, content_type="application/json"
    )
    browser.get("/login/")  # sets the CSRF cookie, as the console's pages do
    allowed = browser.post(
        "/api/v1/holds/decide",
        data={"ids": [1], "approve": True},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=browser.cookies["csrftoken"].value,
    )
    assert refused.status_code == 403
    assert allowed.status_code == 200, allowed.content


# --- item 9: WebSocket origins compared by scheme, host and port ------------------------------------


def _staff_cookie() -> bytes:
    user = get_user_model().objects.create_user("ops-ws", password="pw-for-tests-only", is_staff=True)
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def _opens(path: str, *headers: tuple[bytes, bytes], host: str = HUB) -> bool:
    communicator = WebsocketCommunicator(application, path, headers=[(b"host", host.encode()), *headers])
    accepted, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return bool(accepted)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_console_socket_refuses_a_page_on_another_local_port() -> None:
    cookie = (b"cookie", await sync_to_async(_staff_cookie)())
    assert await _opens("/ws/console/", (b"origin", f"http://{HUB}".encode()), cookie)
    assert not await _opens("/ws/console/", (b"origin", b"http://127.0.0.1:5173"), cookie)
    assert not await _opens("/ws/console/", (b"origin", f"https://{HUB}".encode()), cookie)
    assert not await _opens("/ws/console/", (b"origin", b"http://localhost:8765"), cookie)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_agent_socket_refuses_a_page_on_another_local_port() -> None:
    token = await new_token("alice")
    bearer = (b"authorization", f"Bearer {token}".encode())
    assert await _opens("/ws/agent/", bearer)  # an agent: no Origin at all
    assert await _opens("/ws/agent/", (b"origin", f"http://{HUB}".encode()), bearer)
    assert not await _opens("/ws/agent/", (b"origin", b"http://127.0.0.1:5173"), bearer)
    assert not await _opens("/ws/agent/", bearer, host="evil.example:8765")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_origin_or_host_that_does_not_parse_is_never_the_hub_s_own() -> None:
    """Given a Host the hub answers to by name but whose port is out of range, when a socket
    opens with an Origin that does not parse either (`null`, a sandboxed page's), or with one
    that does, then it is refused: two origins that fail to parse are not the same origin."""
    cookie = (b"cookie", await sync_to_async(_staff_cookie)())
    bad_host = "127.0.0.1:99999"
    for origin in (b"null", b"http://127.0.0.1:99999", f"http://{HUB}".encode()):
        assert not await _opens("/ws/console/", (b"origin", origin), cookie, host=bad_host), origin
    assert not await _opens("/ws/console/", (b"origin", b"null"), cookie)
    assert await _opens("/ws/console/", (b"origin", f"http://{HUB}".encode()), cookie)


# --- item 7: bodies bounded while they are read ------------------------------------------------------

MB = 1024 * 1024


class FeedingClient:
    """An ASGI client that offers a body in 1 MB chunks and counts how many the hub took."""

    def __init__(self, chunks: int, *, chunked: bool = True) -> None:
        self.offered = chunks
        self.taken = 0
        self.chunked = chunked
        self.sent: list[dict[str, Any]] = []
        self._chunk = b"x" * MB  # one buffer, offered again and again: the test holds 1 MB

    async def receive(self) -> dict[str, Any]:
        if self.taken >= self.offered:
            import asyncio

            await asyncio.sleep(3600)  # a client that keeps its connection open
        self.taken += 1
        return {"type": "http.request", "body": self._chunk, "more_body": self.taken < self.offered}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def scope(self, path: str, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
        length = [] if self.chunked else [(b"content-length", str(self.offered * MB).encode())]
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "server": ("127.0.0.1", 8765),
            "client": ("127.0.0.1", 50000),
            "headers": [(b"host", HUB.encode()), (b"content-type", b"application/json"), *length, *headers],
        }

    @property
    def status(self) -> int:
        return self.sent[0]["status"]


def _hub_signed(path: str) -> list[tuple[bytes, bytes]]:
    """For a hub-to-hub route: signature headers that pass the check made before the body is read
    (well-formed, fresh, for this hub), so that the body itself is what gets refused."""
    if not path.startswith("/api/v1/federation/"):
        return []
    from nacl.signing import SigningKey

    from federation.services.identity import hub_identity
    from federation.services.signatures import request_sign

    signed = request_sign(
        method="POST", path=path, body=b"", dest_key=hub_identity().public_key, key=SigningKey.generate()
    ).claim.headers()
    return [(k.lower().encode(), v.encode()) for k, v in signed.items()]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/federation/messages",  # the original attack: 1.2 GB (a forged signature here)
        "/api/v1/messages",
        "/api/v1/holds/decide",  # ninja through the API handler
        "/login/",  # the console, through Django's full handler
    ],
)
async def test_a_chunked_body_is_cut_off_at_its_routes_limit_while_it_is_read(path: str) -> None:
    from hub.request_guard import body_limit

    client = FeedingClient(1200)  # 1.2 GB offered
    await application(client.scope(path, *_hub_signed(path)), client.receive, client.send)
    assert client.status == 413
    assert client.taken * MB <= body_limit(path) + MB  # stopped within a chunk of the limit
    assert client.taken < client.offered


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/api/v1/federation/messages", "/api/v1/messages", "/login/"])
async def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(path: str) -> None:
    client = FeedingClient(300, chunked=False)  # Content-Length: 300 MB
    await application(client.scope(path), client.receive, client.send)
    assert client.status == 413
    assert client.taken == 0


def test_the_hub_to_hub_routes_take_larger_bodies_than_ordinary_calls() -> None:
    from hub.request_guard import body_limit

    assert body_limit("/api/v1/federation/messages") > body_limit("/api/v1/files")
    assert (
        body_limit("/api/v1/files") > body_limit("/api/v1/messages") == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    )


def _daphne_connection() -> tuple[Any, Any]:
    """Daphne's HTTP protocol for one connection, on an in-memory transport."""
    from daphne.http_protocol import HTTPFactory
    from twisted.internet.testing import StringTransport

    class Server:
        root_path = ""

        def protocol_connected(self, protocol: Any) -> None:
            pass

        def protocol_disconnected(self, protocol: Any) -> None:
            pass

    transport = StringTransport()
    protocol = HTTPFactory(Server()).buildProtocol(("127.0.0.1", 1))
    protocol.makeConnection(transport)
    return protocol, transport


@pytest.mark.parametrize("path", [b"/api/v1/messages", b"/api/v1/federation/messages"])
def test_daphne_refuses_a_declared_length_over_the_limit_before_reading_the_body(path: bytes) -> None:
    protocol, transport = _daphne_connection()
    protocol.dataReceived(
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
        % (path, 2 * 1024 * MB)
    )
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in transport.value()
    assert transport.disconnecting


def test_daphne_cuts_a_chunked_body_off_at_the_limit_while_receiving_it() -> None:
    from hub.request_guard import body_limit

    protocol, transport = _daphne_connection()
    protocol.dataReceived(
        b"POST /api/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    request = protocol._channel.requests[-1]
    chunk = b"%x\r\n%s\r\n" % (MB, b"x" * MB)
    fed = 0
    while not transport.disconnecting and fed < 100:
        protocol.dataReceived(chunk)
        fed += 1
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    assert fed * MB <= body_limit("/api/v1/messages") + MB
    assert request.content.tell() <= body_limit("/api/v1/messages")


# --- item 7: uploads stream to disk, stop at the limit, have a quota; unused files are removed ------


def _multipart(data: bytes, name: str = "notes.txt") -> tuple[bytes, bytes]:
    boundary = b"----sb-test-boundary"
    head = (
        b'--%s\r\nContent-Disposition: form-data; name="file"; filename="%s"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" % (boundary, name.encode())
    )
    return head + data + b"\r\n--%s--\r\n" % boundary, b"multipart/form-data; boundary=" + boundary


async def _upload_through_the_hub(
    token: str, data: bytes, *, chunked: bool = False, peak: list[int] | None = None
) -> tuple[int, int]:
    """POST /api/v1/files through the ASGI application, the body offered in 1 MB slices;
    returns the status and how many slices the hub took. With `peak`, appends the most memory
    allocated while the hub handled it (tracemalloc: the body itself was made before)."""
    body, content_type = _multipart(data)
    view = memoryview(body)
    slices = [view[i : i + MB] for i in range(0, len(body), MB)]
    taken = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if taken >= len(slices):
            import asyncio

            await asyncio.sleep(3600)
        taken += 1
        return {"type": "http.request", "body": bytes(slices[taken - 1]), "more_body": taken < len(slices)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    client = FeedingClient(0, chunked=chunked)
    scope = client.scope("/api/v1/files", (b"authorization", f"Bearer {token}".encode()))
    scope["headers"] = [h for h in scope["headers"] if h[0] not in (b"content-type", b"content-length")]
    scope["headers"].append((b"content-type", content_type))
    if not chunked:
        scope["headers"].append((b"content-length", str(len(body)).encode()))
    if peak is not None:
        tracemalloc.start()
    try:
        await application(scope, receive, send)
    finally:
        if peak is not None:
            peak.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    return sent[0]["status"], taken


@pytest.fixture(autouse=True)
def _own_files_dir(settings: Any, tmp_path: Any) -> None:
    """Each test stores files in a folder of its own (the setting is read once, at start-up)."""
    settings.SWITCHBOARD_FILES_DIR = tmp_path / "files"


def _stored_files() -> list[str]:
    store = settings.SWITCHBOARD_FILES_DIR / "store"
    return sorted(p.name for p in store.rglob("*") if p.is_file()) if store.exists() else []


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("chunked", [False, True])
async def test_an_upload_over_the_limit_stops_at_the_limit_and_leaves_no_file(
    chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from federation.services import files

    monkeypatch.setitem(files.TIER_LIMITS, "host", (2 * MB, 4 * MB))
    token = await new_token("alice")
    status, taken = await _upload_through_the_hub(token, b"u" * (40 * MB), chunked=chunked)
    assert status == 413
    assert taken <= 4  # 2 MB and its multipart frame, not the 40 MB offered
    assert _stored_files() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_upload_streams_to_disk_instead_of_memory() -> None:
    import hashlib

    token = await new_token("alice")
    data = b"s" * (24 * MB)
    peak: list[int] = []
    status, _ = await _upload_through_the_hub(token, data, peak=peak)
    assert status == 201
    assert peak[0] < 8 * MB, f"{peak[0] / MB:.1f} MB held while uploading 24 MB"
    assert _stored_files() == [hashlib.sha256(data).hexdigest()]


@pytest.mark.django_db
def test_a_session_cannot_upload_past_its_quota_of_files_no_message_uses(api, register, settings) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.SWITCHBOARD_FILE_QUOTA_BYTES = 3000
    alice, _bob = register("alice"), register("bob")

    def upload(data: bytes) -> Any:
        return api.client.post(
            "/api/v1/files",
            {"file": SimpleUploadedFile("f.bin", data)},
            HTTP_AUTHORIZATION=f"Bearer {alice.token}",
        )

    first = upload(b"a" * 2000)
    again = upload(b"a" * 2000)  # the same file counts once
    over = upload(b"b" * 2000)
    assert first.status_code == 201 and again.status_code == 201
    assert over.status_code == 413 and over.json()["error"] == "too_large"
    assert len(_stored_files()) == 1  # nothing kept of the refused one

    sent = api.post(
        "messages",
        alice.token,
        {"to": "bob", "message": "file", "files": [{"sha256": first.json()["sha256"]}]},
    )
    assert sent.status_code == 201, sent.json_body
    assert upload(b"b" * 2000).status_code == 201  # the attached file no longer counts


@pytest.mark.django_db
def test_stored_files_no_message_uses_are_removed_after_their_grace_period(api, register, settings) -> None:
    from datetime import timedelta

    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.utils import timezone

    from federation.models import Attachment, FileUpload
    from federation.tasks import files_cleanup
    from messaging.jobs import PERIODIC_JOBS

    alice, _bob = register("alice"), register("bob")

    def upload(data: bytes) -> str:
        answer = api.client.post(
            "/api/v1/files",
            {"file": SimpleUploadedFile("f.bin", data)},
            HTTP_AUTHORIZATION=f"Bearer {alice.token}",
        )
        assert answer.status_code == 201
        return answer.json()["sha256"]

    unused, attached, recent = upload(b"never sent"), upload(b"sent"), upload(b"just uploaded")
    api.post("messages", alice.token, {"to": "bob", "message": "file", "files": [{"sha256": attached}]})
    long_ago = timezone.now() - timedelta(seconds=settings.SWITCHBOARD_FILE_ORPHAN_SECONDS + 60)
    Attachment.objects.filter(sha256__in=[unused, attached]).update(created_at=long_ago)
    FileUpload.objects.filter(attachment__sha256__in=[unused, attached]).update(uploaded_at=long_ago)

    assert "federation.tasks.files_cleanup" in {job.task_name for job in PERIODIC_JOBS}
    assert files_cleanup.apply().get() == 1
    assert sorted(Attachment.objects.values_list("sha256", flat=True)) == sorted([attached, recent])
    assert _stored_files() == sorted([attached, recent])
    assert not FileUpload.objects.filter(attachment__sha256=unused).exists()


# --- item 10: the API docs load nothing from another origin ----------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_api_docs_load_only_scripts_and_styles_the_hub_serves() -> None:
    import re

    async with hub_client() as http:
        page = await http.get("/api/docs")
        assert page.status_code == 200
        assets = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', page.text)
        scripts = re.findall(r'<script[^>]+src="([^"]+)"', page.text)
        assert scripts, page.text
        assert all(a.startswith("/") and not a.startswith("//") for a in assets), assets
        loaded = {a: await http.get(a) for a in assets}
    assert all(r.status_code == 200 and r.content for r in loaded.values()), {
        a: r.status_code for a, r in loaded.items()
    }
    assert any("SwaggerUIBundle" in loaded[s].text for s in scripts)
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]


# --- against a real `switchboard serve` process (daphne) -------------------------------------------


@pytest.fixture
def served_hub(tmp_path: Any) -> Any:
    """A real `switchboard serve` process (daphne on its own loopback port)."""
    from hub_topology.embedded import start_hub

    home = tmp_path / "served-home"
    home.mkdir(mode=0o700)
    hub = start_hub(home)
    try:
        yield hub
    finally:
        hub.stop()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def _post_chunked(url: str, path: str, *, megabytes: int, seconds: float) -> tuple[int, bytes]:
    """POST `megabytes` of chunked body on a raw socket until the hub stops reading; returns the
    megabytes sent and the start of the answer."""
    import socket
    import time
    from urllib.parse import urlsplit

    where = urlsplit(url)
    chunk = b"%x\r\n%s\r\n" % (MB, b"x" * MB)
    sent = 0
    deadline = time.monotonic() + seconds
    with socket.create_connection((where.hostname, where.port), timeout=10) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/json\r\n\r\n".encode()
        )
        try:
            while sent < megabytes and time.monotonic() < deadline:
                conn.sendall(chunk)
                sent += 1
        except OSError:
            pass  # the hub closed the connection: it stopped reading
        try:
            answer = conn.recv(200)
        except OSError:
            answer = b""
    return sent, answer


@pytest.mark.e2e
@pytest.mark.parametrize("path", ["/api/v1/messages", "/api/v1/federation/messages"])
def test_a_real_hub_cuts_off_a_huge_chunked_post_and_its_memory_stays_flat(
    served_hub: Any, path: str
) -> None:
    """The reported attack: 1.2 GB chunked took the hub from 0.14 to 2.6 GB before its 401."""
    from hub.request_guard import body_limit

    pid = served_hub.process.pid
    before = _rss_kb(pid)
    sent, answer = _post_chunked(served_hub.url, path, megabytes=1200, seconds=120)
    after = _rss_kb(pid)
    assert sent < 1200, "the hub read the whole body"
    assert sent * MB <= body_limit(path) + 64 * MB  # the socket buffers hold some beyond the cut
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413 "), answer
    assert after - before < 64 * 1024, f"RSS grew from {before} kB to {after} kB"
    assert httpx.get(served_hub.url + "/api/v1/ping", timeout=10).status_code == 401  # still serving


@pytest.mark.e2e
def test_the_api_docs_render_in_a_browser_from_the_hubs_own_files(served_hub: Any) -> None:
    from playwright.sync_api import sync_playwright

    from tests.e2e.console_world import CHROMIUM, CHROMIUM_ARGS

    requested: list[str] = []
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.on("request", lambda request: requested.append(request.url))
            page.on(
                "console", lambda message: problems.append(message.text) if message.type == "error" else None
            )
            page.goto(served_hub.url + "/api/docs")
            page.wait_for_selector(".swagger-ui .opblock", timeout=15_000)  # the operations rendered
        finally:
            browser.close()
    assert requested and all(url.startswith(served_hub.url + "/") for url in requested), requested
    assert not problems, problems


def test_the_hubs_own_public_url_is_a_host_it_answers_to(tmp_path: Any) -> None:
    """Other hubs call this one at its public URL: that name is allowed, no other is added."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_") and k != "DATABASE_URL"}
    env.update(SWITCHBOARD_HOME=str(tmp_path), SWITCHBOARD_PUBLIC_URL="http://relay.example:9000")
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'hub.settings'; django.setup(); "
        "from django.conf import settings; print(','.join(settings.ALLOWED_HOSTS))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().split(",") == ["127.0.0.1", "localhost", "[::1]", "::1", "relay.example"]
