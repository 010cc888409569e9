"""The agent-side `switchboard` commands against an in-process hub: output and exit codes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from messaging.models import Delivery
from switchboard_agent.cli import main
from switchboard_agent.client import HubClient
from switchboard_agent.install import hooks_settings, install, merge_hooks
from tests.agents.lossy import LosesAnswers


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_TOKEN", raising=False)
    monkeypatch.delenv("SWITCHBOARD_NAME", raising=False)


def test_a_script_registers_sends_pulls_and_acks(inprocess_hub: str, register, send, capsys) -> None:
    bob = register("bob")

    code, out, _ = run(capsys, "register", "--name", "ci-bot", "--save", "ci", "--json")
    assert code == 0
    saved = Path(os.environ["SWITCHBOARD_HOME"]) / "sessions" / "ci.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    me = json.loads(out)

    code, out, _ = run(capsys, "agents", "--session", "ci", "--json")
    assert code == 0 and {a["name"] for a in json.loads(out)} == {"bob", "ci-bot"}

    code, out, _ = run(capsys, "send", "bob", "build 512 is green", "--session", "ci", "--summary", "ci")
    assert code == 0 and out.startswith(f"Queued for bob [{bob.ref}]")
    sent_id = out.strip().rsplit(" ", 1)[1]
    code, out, _ = run(capsys, "status", sent_id, "--session", "ci")
    assert code == 0 and out.startswith(f"queued  (to bob [{bob.ref}])") and "delivery.queued" in out

    code, out, err = run(capsys, "inbox", "--session", "ci")
    assert (code, out) == (1, "") and "No messages waiting" in err  # nothing to do
    code, out, err = run(capsys, "inbox", "--session", "ci", "--json")
    assert (code, json.loads(out)) == (1, []) and "No messages waiting" in err  # still JSON for jq

    message_id = send(bob, "ci-bot", "thanks").json_body["id"]
    code, out, _ = run(capsys, "inbox", "--session", "ci", "--json")
    assert code == 0 and [m["id"] for m in json.loads(out)] == [message_id]

    code, out, _ = run(capsys, "ack", message_id, "--session", "ci")
    assert code == 0 and out.startswith("acked 1")
    assert Delivery.objects.get(message_id=message_id).state == "read"
    code, _, _ = run(capsys, "ack", message_id, "--session", "ci")
    assert code == 1  # already read: nothing to do

    code, out, _ = run(capsys, "status", "--set", "idle", "--final-answer", "done", "--session", "ci")
    assert code == 0 and out.strip() == f"ci-bot [{me['ref']}] is idle"


def test_exit_codes_tell_usage_hub_and_unreachable_apart(
    inprocess_hub: str, register, capsys, monkeypatch
) -> None:
    code, _, err = run(capsys, "inbox")
    assert code == 2 and "SWITCHBOARD_TOKEN" in err  # no identity: usage
    code, _, _ = run(capsys, "send")
    assert code == 2  # missing arguments: usage

    monkeypatch.setenv("SWITCHBOARD_TOKEN", register("alice").token)
    code, _, err = run(capsys, "send", "nobody-here", "hi")
    assert code == 3 and "[not_found]" in err  # the hub refused

    monkeypatch.setattr(HubClient, "default_transport", None)  # real network, to a closed port
    code, _, err = run(capsys, "agents", "--url", "http://127.0.0.1:9")
    assert code == 4 and "Retry later" in err  # the hub is unreachable


def test_registering_without_an_enrollment_key_is_a_usage_error_not_the_hubs(
    inprocess_hub: str, capsys, monkeypatch, tmp_path: Path
) -> None:
    """The hub is never asked: nothing it refused, so not exit 3."""
    monkeypatch.delenv("SWITCHBOARD_ENROLL_KEY", raising=False)
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))  # a home without enroll.key
    code, out, err = run(capsys, "register", "--name", "ci-bot")
    assert (code, out) == (2, "") and "No enrollment key" in err and "[no_enroll_key]" in err


def test_inbox_after_a_lost_answer_says_how_to_see_what_was_handed_over(
    inprocess_hub: str, register, send, capsys, monkeypatch
) -> None:
    bob = register("bob")
    sent = send(register("alice"), "bob", "the release is tagged").json_body["id"]
    monkeypatch.setenv("SWITCHBOARD_TOKEN", bob.token)
    lossy = LosesAnswers(HubClient.default_transport, lose=1, answer="503")
    monkeypatch.setattr(HubClient, "default_transport", lossy)

    code, out, err = run(capsys, "inbox")
    assert (code, out) == (3, "") and "`switchboard inbox --unacked` shows them" in err

    code, out, _ = run(capsys, "inbox", "--unacked", "--json")
    assert code == 0 and [m["id"] for m in json.loads(out)] == [sent]


def test_tasks_commands_work_the_board(inprocess_hub: str, register, api, capsys, monkeypatch) -> None:
    lead = register("lead-1")
    team = api.post("teams", lead.token, {"name": "core"}).json_body
    monkeypatch.setenv("SWITCHBOARD_TOKEN", lead.token)

    code, out, _ = run(capsys, "tasks", "create", "Write the changelog", "--json")
    assert code == 0
    task = json.loads(out)[0]
    code, out, _ = run(capsys, "tasks", "claim", str(task["id"]))
    assert code == 0 and "in_progress" in out
    code, out, _ = run(capsys, "tasks", "done", str(task["id"]), "--result", "written")
    assert code == 0 and "completed" in out
    code, out, _ = run(capsys, "tasks", "list", "--status", "pending")
    assert code == 1  # nothing pending
    assert team["id"]


def test_team_commands_invite_accept_and_allow_a_watcher(
    inprocess_hub: str, register, api, capsys, monkeypatch
) -> None:
    lead, mate = register("lead-2"), register("mate-2")
    register("other-2")
    api.post("teams", lead.token, {"name": "core"})
    monkeypatch.setenv("SWITCHBOARD_TOKEN", lead.token)
    code, out, err = run(capsys, "team", "invite", "mate-2", "--json")
    assert code == 0, err
    invitation = json.loads(out)["invitation"]
    assert (
        invitation["answer_by"] == "session" and api.get("teams/mine", mate.token).json_body["team"] is None
    )

    monkeypatch.setenv("SWITCHBOARD_TOKEN", mate.token)
    code, out, _ = run(capsys, "team", "invitations")
    assert code == 0 and invitation["id"] in out
    code, out, _ = run(capsys, "team", "accept", invitation["id"])
    assert code == 0 and out.startswith("mate-2 joined the team")
    assert api.get("teams/mine", mate.token).json_body["member"]["name"] == "mate-2"

    code, out, _ = run(capsys, "team", "allow-watcher", "other-2")
    assert code == 0 and "may read your final answers" in out
    code, out, _ = run(capsys, "team", "watchers")
    assert code == 0 and "other-2" in out


def test_team_join_says_what_the_hub_said_when_the_lead_has_not_invited_you(
    inprocess_hub: str, register, api, capsys, monkeypatch
) -> None:
    """Asking a lead that never invited this session is answered the same whether or not it leads
    a team (no invitation shown): the command prints the hub's sentence, not an empty invitation."""
    lead = register("lead-3")
    asker = register("asker-3")
    api.post("teams", lead.token, {"name": "core"})
    monkeypatch.setenv("SWITCHBOARD_TOKEN", asker.token)

    code, out, err = run(capsys, "team", "join", "lead-3")

    assert code == 0, err
    assert out.startswith("No invitation for you from lead-3") and "None" not in out
    # The asker lists its own request and withdraws it.
    code, out, _ = run(capsys, "team", "requests", "--json")
    [request] = json.loads(out)
    assert code == 0 and request["lead_label"].startswith("lead-3")
    code, out, _ = run(capsys, "team", "withdraw", request["id"])
    assert code == 0 and out.startswith(f"Request {request['id']} withdrawn")
    code, out, _ = run(capsys, "team", "requests")
    assert (code, out) == (1, "")


def test_team_invitations_reaches_every_page_one_at_a_time(
    inprocess_hub: str, register, api, capsys, monkeypatch
) -> None:
    """A lead with more requests to join than one page lists them a page at a time: each page
    ends with the command that shows the next; with --json stdout stays the list of rows."""
    monkeypatch.setattr("teams.services.invitations.INVITATIONS_PAGE", 2)
    lead = register("lead-4")
    api.post("teams", lead.token, {"name": "core"})
    for n in range(3):
        assert api.post("teams/join", register(f"asker-4{n}").token, {"lead": lead.id}).status_code == 202
    monkeypatch.setenv("SWITCHBOARD_TOKEN", lead.token)

    code, out, _ = run(capsys, "team", "invitations")
    *first, more = out.splitlines()
    assert code == 0 and len(first) == 2 and more.startswith("more: switchboard team invitations --before ")
    code, out, _ = run(capsys, *more.removeprefix("more: switchboard ").split())
    last = out.splitlines()
    assert code == 0 and len(last) == 1 and "more:" not in out
    rows = first + last  # newest first, each once
    assert [row.split()[3] for row in rows] == ["asker-42", "asker-41", "asker-40"], rows
    seen = [row.split()[0] for row in rows]

    code, out, err = run(capsys, "team", "invitations", "--json")
    page = json.loads(out)
    assert code == 0 and [i["id"] for i in page] == seen[:2]
    assert err.strip() == f"more: switchboard team invitations --before {seen[1]}"
    code, out, err = run(capsys, "team", "invitations", "--json", "--before", seen[1])
    assert (code, [i["id"] for i in json.loads(out)], err) == (0, seen[2:], "")

    code, out, err = run(capsys, "team", "invitations", "--before", "not-an-id")
    assert code == 3 and out == "" and "before" in err  # the hub's sentence on the bad cursor


def test_install_hooks_prints_then_merges_without_clobbering(tmp_path: Path, capsys) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    existing: dict[str, Any] = {
        "model": "x",
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]},
    }
    settings.write_text(json.dumps(existing))

    code, out, _ = run(capsys, "install-hooks", "--project-dir", str(tmp_path))
    assert code == 0 and "Nothing was written" in out
    assert json.loads(settings.read_text()) == existing

    install(scope="project", project_dir=tmp_path, write=True)
    install(scope="project", project_dir=tmp_path, write=True)  # twice: still one entry per event
    merged = json.loads(settings.read_text())
    assert merged["model"] == "x"
    assert set(merged["hooks"]) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd"}
    assert [h["command"] for g in merged["hooks"]["Stop"] for h in g["hooks"]][0] == "say done"
    assert sum(" hook --url " in h["command"] for g in merged["hooks"]["Stop"] for h in g["hooks"]) == 1
    mcp = json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]["switchboard"]
    assert mcp["args"][-1] == "mcp" and mcp["env"]["SWITCHBOARD_ATTACH"] == "hooks"
    assert merge_hooks(merged, hooks_settings()) == merged


def test_install_hooks_creates_settings_files_owner_only_and_keeps_an_existing_file_s_mode(
    tmp_path: Path,
) -> None:
    before = os.umask(0o022)  # most accounts' umask: a file made the usual way would be 0644
    try:
        shared = tmp_path / "shared"
        (shared / ".claude").mkdir(parents=True)
        theirs = shared / ".claude" / "settings.json"
        theirs.write_text("{}")
        theirs.chmod(0o644)

        install(scope="project", project_dir=tmp_path / "new", write=True)
        install(scope="project", project_dir=shared, write=True)
    finally:
        os.umask(before)

    created = [tmp_path / "new" / ".claude" / "settings.json", tmp_path / "new" / ".mcp.json"]
    assert [stat.S_IMODE(f.stat().st_mode) for f in created] == [0o600, 0o600]
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o644  # the user's file, the user's mode
    assert "hooks" in json.loads(theirs.read_text())


def test_common_options_work_before_the_subcommand_too(inprocess_hub: str, register, capsys) -> None:
    register("bob")
    code, _, _ = run(capsys, "register", "--name", "ci-bot", "--save", "ci")
    assert code == 0

    code, out, err = run(capsys, "--session", "ci", "--json", "agents")
    assert code == 0, err
    assert {a["name"] for a in json.loads(out)} == {"bob", "ci-bot"}
    code, out, _ = run(capsys, "--json", "agents", "--session", "ci")  # mixed: both places count
    assert code == 0 and json.loads(out)


def test_register_prints_only_what_a_script_consumes_on_stdout(inprocess_hub: str, capsys) -> None:
    code, out, err = run(capsys, "register", "--name", "ci-bot")

    assert code == 0
    assert out.splitlines() == [f"export SWITCHBOARD_TOKEN={out.split('=', 1)[1].strip()}"]
    assert err.startswith("Registered ci-bot [")
    code, out, err = run(capsys, "register", "--name", "ci-bot-2", "--save", "two")
    assert (code, out) == (0, "") and "Saved as session 'two'" in err


def test_deregister_removes_the_saved_session(inprocess_hub: str, capsys) -> None:
    run(capsys, "register", "--name", "ci-bot", "--save", "ci")
    saved = Path(os.environ["SWITCHBOARD_HOME"]) / "sessions" / "ci.json"
    assert saved.exists()

    code, out, _ = run(capsys, "deregister", "--session", "ci")

    assert code == 0 and "has exited" in out
    assert not saved.exists()
    code, _, err = run(capsys, "agents", "--session", "ci")
    assert code == 2 and "No saved session 'ci'" in err
