"""Conversation downloads from the console (operators only, streamed, with a clear file name) and
`manage.py export_conversation` (pair or team, range, format, output file, clear errors)."""

from __future__ import annotations

import io
import json
import stat

import pytest
from django.core.management import CommandError, call_command

from messaging.models import AuditEvent
from tests.teams.conftest import join_team


@pytest.fixture
def chat(register, send):
    """alice and bob wrote to each other; carol wrote to alice."""
    alice, bob, carol = register("alice"), register("bob"), register("carol")
    for sender, to, text in ((alice, "bob", "hi bob"), (bob, "alice", "hi alice"), (carol, "alice", "aside")):
        assert send(sender, to, text).status_code == 201
    return alice, bob, carol


def _body(response) -> str:
    return b"".join(response.streaming_content).decode()


def test_an_operator_downloads_a_pair_from_the_session_page(operator_client, chat):
    alice, bob, _ = chat
    page = operator_client.get(f"/sessions/{alice.id}/")
    assert f'action="/sessions/{alice.id}/export"' in page.content.decode()

    response = operator_client.get(f"/sessions/{alice.id}/export", {"with": bob.ref, "format": "jsonl"})

    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("application/x-ndjson")
    disposition = response["Content-Disposition"]
    assert disposition.startswith('attachment; filename="switchboard-pair-alice-') and disposition.endswith(
        '.jsonl"'
    )
    records = [json.loads(line) for line in _body(response).splitlines()]
    assert [r["text"] for r in records] == ["hi bob", "hi alice"]
    [event] = AuditEvent.objects.filter(kind="conversation.exported")
    assert event.actor == "operator:op" and event.detail["messages"] == 2


def test_a_markdown_download_of_a_team_from_the_team_page(operator_client, api, register, send):
    lead, alice = register("lead-one"), register("alice")
    team_id = api.post("teams", lead.token, {"name": "build"}).json_body["id"]
    join_team(api, lead, team_id, alice)
    assert send(lead, "alice", "start task 1").status_code == 201
    page = operator_client.get(f"/teams/{team_id}/")
    assert f"/teams/{team_id}/export?format=md" in page.content.decode()

    response = operator_client.get(f"/teams/{team_id}/export", {"format": "md", "since": "2000-01-01"})

    assert response.status_code == 200 and response["Content-Type"].startswith("text/markdown")
    assert 'filename="switchboard-team-build-' in response["Content-Disposition"]
    body = _body(response)
    assert body.startswith("# Conversation: team build") and "start task 1" in body


def test_bad_requests_are_refused_clearly(operator_client, chat):
    alice, bob, _ = chat
    url = f"/sessions/{alice.id}/export"
    assert operator_client.get(url, {"with": bob.id, "format": "csv"}).status_code == 400
    bad_time = operator_client.get(url, {"with": bob.id, "since": "yesterday"})
    assert bad_time.status_code == 400 and b"ISO 8601" in bad_time.content
    assert operator_client.get(url, {}).status_code == 400
    assert operator_client.get(url, {"with": "nobody"}).status_code == 404
    assert operator_client.get(f"/teams/{alice.id}/export").status_code == 404


def test_the_export_needs_an_operator_login(client, visitor_client, chat):
    alice, bob, _ = chat
    url = f"/sessions/{alice.id}/export?with={bob.id}"
    for browser in (client, visitor_client):
        response = browser.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    assert not AuditEvent.objects.filter(kind="conversation.exported").exists()


def test_the_command_exports_a_pair_to_stdout_and_a_team_to_a_private_file(
    chat, api, register, send, tmp_path
):
    alice, bob, _ = chat
    out = io.StringIO()
    call_command("export_conversation", "--pair", alice.ref, bob.id, "--format", "jsonl", stdout=out)
    assert [json.loads(line)["text"] for line in out.getvalue().splitlines()] == ["hi bob", "hi alice"]

    team_id = api.post("teams", alice.token, {"name": "pairing"}).json_body["id"]
    join_team(api, alice, team_id, bob)
    target = tmp_path / "team.md"
    call_command(
        "export_conversation",
        "--team",
        team_id,
        "--format",
        "md",
        "--output",
        str(target),
        stderr=io.StringIO(),
    )
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert "hi bob" in target.read_text() and "aside" not in target.read_text()
    actors = set(AuditEvent.objects.filter(kind="conversation.exported").values_list("actor", flat=True))
    assert len(actors) == 1 and next(iter(actors)).startswith("operator:manage.py:")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--pair", "nobody", "x"], "No session has the id or ref"),
        (["--team", "not-a-team"], "No team has the id"),
        (["--pair", "{a}", "{b}", "--since", "soon"], "ISO 8601"),
        (["--pair", "{a}", "{b}", "--since", "2026-02-01", "--until", "2026-01-01"], "time range is empty"),
        (["--pair", "{a}", "{a}"], "two different sessions"),
        (["--pair", "{a}", "{b}", "--output", "/nonexistent-dir/x.jsonl"], "Cannot write"),
    ],
)
def test_the_command_refuses_bad_input_with_a_clear_error(chat, args, says):
    alice, bob, _ = chat
    argv = [a.format(a=alice.ref, b=bob.ref) for a in args]
    with pytest.raises(CommandError, match=says):
        call_command("export_conversation", *argv, stdout=io.StringIO())


def test_the_command_exits_non_zero_on_bad_input(chat, capsys):
    from django.core.management import execute_from_command_line

    with pytest.raises(SystemExit) as exited:
        execute_from_command_line(["manage.py", "export_conversation", "--pair", "nobody", "x"])
    assert exited.value.code == 1 and "No session has the id or ref" in capsys.readouterr().err


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_under_asgi_the_export_streams_as_an_async_iterator_and_is_audited(register, send):
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model
    from django.test import AsyncClient

    alice, bob = await sync_to_async(register)("alice"), await sync_to_async(register)("bob")
    for i in range(3):
        assert (await sync_to_async(send)(alice, "bob", f"note {i}")).status_code == 201
    user = await get_user_model().objects.acreate_user("op", password="op-password-123", is_staff=True)
    browser = AsyncClient()
    await browser.aforce_login(user)

    response = await browser.get(f"/sessions/{alice.id}/export", {"with": bob.ref, "format": "jsonl"})

    assert response.status_code == 200 and response.is_async
    body = "".join([part.decode() async for part in response.streaming_content])
    assert [json.loads(line)["text"] for line in body.splitlines()] == ["note 0", "note 1", "note 2"]
    event = await AuditEvent.objects.filter(kind="conversation.exported").aget()
    assert event.detail["complete"] is True and event.detail["messages"] == 3
