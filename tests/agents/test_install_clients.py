"""`switchboard install-hooks --client claude|codex|gemini` writes each client's own config (merged
into what the user has), and the written command lines, run as each client runs them with the
payloads its documentation shows, reach the same hub as the written MCP server."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomlkit

from hub_topology import REPO
from hub_topology.embedded import Hub
from switchboard_agent.cli import main
from switchboard_agent.install import CLIENT_NAMES, hook_argv, mcp_config
from tests.agents.client_stub import Stub
from tests.agents.codex_payloads import codex_event
from tests.agents.test_hook_identity import REGISTERED, agent_env, enroll


def install_cli(project: Path, *args: str) -> int:
    try:
        return main(["install-hooks", "--project-dir", str(project), "--write", *args])
    except SystemExit as exc:
        return int(exc.code or 0)


def client_env(hub: Hub, home: Path) -> dict[str, str]:
    """What the agent client passes on: the user's environment, which does not name this hub
    (only the installed config does)."""
    env = agent_env(hub, home)
    del env["SWITCHBOARD_URL"]
    return env


def agents(hub: Hub, token: str) -> dict[str, dict[str, Any]]:
    found = httpx.get(
        f"{hub.url}/api/v1/agents",
        params={"include_exited": "true"},
        headers={"Authorization": f"Bearer {token}"},
    ).json()["agents"]
    return {a["name"]: a for a in found}


# --- Claude Code --------------------------------------------------------------------------------
@pytest.mark.e2e
def test_claude_code_hooks_reach_the_mcp_server_s_hub_on_a_non_default_port(
    hub_process: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = hub_process
    project, home = tmp_path / "payments", tmp_path / "agent-home"
    project.mkdir()
    home.mkdir(mode=0o700)
    monkeypatch.setenv("SWITCHBOARD_URL", hub.url)  # the hub the user installs against

    assert install_cli(project) == 0

    settings = json.loads((project / ".claude" / "settings.json").read_text())
    server = json.loads((project / ".mcp.json").read_text())["mcpServers"]["switchboard"]
    assert server["env"]["SWITCHBOARD_URL"] == hub.url
    line = settings["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    assert all(
        h["command"] == line for groups in settings["hooks"].values() for g in groups for h in g["hooks"]
    )
    stub = Stub(client_env(hub, home), str(REPO))
    try:
        out = stub.hook(
            line,
            {
                "session_id": "0d9a7c2e-4f61-4b8a-9c3e-5a1b2c3d4e5f",
                "transcript_path": "/tmp/t.jsonl",
                "cwd": str(project),
                "permission_mode": "default",
                "hook_event_name": "SessionStart",
                "source": "startup",
            },
        )
    finally:
        stub.close()
    assert out["code"] == 0 and out["answer"] is not None, (home / "agent.log").read_text()
    assert REGISTERED.search(out["answer"]["hookSpecificOutput"]["additionalContext"])
    # A new session sits at its first prompt: idle until a turn starts.
    assert agents(hub, enroll(hub, "watcher")["token"])["payments"]["status"] == "idle"


# --- Gemini CLI ---------------------------------------------------------------------------------
GEMINI_USER_SETTINGS = {
    "theme": "GitHub",
    "hooks": {
        "AfterTool": [{"matcher": "write_file", "hooks": [{"type": "command", "command": "./lint.sh"}]}]
    },
    "mcpServers": {"github": {"command": "gh-mcp", "args": []}},
}


def gemini_event(name: str, **fields: Any) -> dict[str, Any]:
    """Gemini CLI's hook input (docs/hooks/reference.md: base fields, then the event's own)."""
    return {
        "session_id": "8a1c3f5e-2b4d-4e6f-9a0b-1c2d3e4f5a6b",
        "transcript_path": "/home/u/.gemini/tmp/chats/session.json",
        "cwd": "/work/frontend",
        "hook_event_name": name,
        "timestamp": "2026-12-04T12:00:00.000Z",
        **fields,
    }


def test_gemini_install_merges_settings_json_keeping_the_user_s(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    settings = tmp_path / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps(GEMINI_USER_SETTINGS))
    settings.chmod(0o644)

    assert install_cli(tmp_path, "--client", "gemini") == 0
    assert install_cli(tmp_path, "--client", "gemini") == 0  # twice: still one entry per event

    written = json.loads(settings.read_text())
    assert written["theme"] == "GitHub" and written["mcpServers"]["github"] == {
        "command": "gh-mcp",
        "args": [],
    }
    assert set(written["hooks"]) == {"SessionStart", "BeforeAgent", "AfterTool", "AfterAgent", "SessionEnd"}
    after_tool = [h["command"] for g in written["hooks"]["AfterTool"] for h in g["hooks"]]
    assert after_tool[0] == "./lint.sh" and len(after_tool) == 2
    ours = written["hooks"]["AfterAgent"][0]["hooks"][0]
    assert ours["timeout"] == 10_000  # Gemini's timeouts are in milliseconds
    assert shlex.split(ours["command"])[-6:] == [
        "--client",
        "gemini",
        "--url",
        "http://127.0.0.1:9123",
        "||",
        "true",
    ]
    server = written["mcpServers"]["switchboard"]
    assert server["env"] == {
        "SWITCHBOARD_URL": "http://127.0.0.1:9123",
        "SWITCHBOARD_ATTACH": "hooks",
        "SWITCHBOARD_CLIENT": "gemini",  # not Claude Code's server, whatever session id it inherits
    }
    assert stat.S_IMODE(settings.stat().st_mode) == 0o644  # the user's file keeps its mode


def test_a_gemini_hook_line_whose_switchboard_is_gone_does_not_block_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemini CLI 0.61 takes a hook's exit code 2 or more as blocking: bash's 127 for a command not
    found stopped every prompt. The written line exits 0 there, its error left on stderr (which
    Gemini shows its user as a warning)."""
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    assert install_cli(tmp_path, "--client", "gemini") == 0
    written = json.loads((tmp_path / ".gemini" / "settings.json").read_text())
    line = written["hooks"]["BeforeAgent"][0]["hooks"][0]["command"]
    gone = line.replace(shlex.split(line)[0], str(tmp_path / "moved-venv" / "switchboard"))

    done = subprocess.run(["bash", "-c", gone], input="{}", capture_output=True, text=True, timeout=30)

    assert done.returncode == 0 and done.stdout == ""
    assert "No such file or directory" in done.stderr


def test_gemini_install_tells_what_the_user_still_does_in_gemini(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemini CLI 0.61 runs a project's hooks and MCP server only in a trusted folder
    (tests/clients/test_gemini.py): install-hooks says so, and that the folder is the user's to trust."""
    assert install_cli(tmp_path, "--client", "gemini") == 0

    said = " ".join(capsys.readouterr().out.split())
    assert "only in a trusted folder" in said and "--skip-trust" in said
    assert "--yolo" not in said


@pytest.mark.e2e
def test_a_gemini_cli_session_through_the_written_hooks_and_mcp_server(
    hub_process: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = hub_process
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("SWITCHBOARD_URL", hub.url)
    assert install_cli(tmp_path, "--client", "gemini") == 0
    written = json.loads((tmp_path / ".gemini" / "settings.json").read_text())
    line = written["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    server = written["mcpServers"]["switchboard"]
    bob = enroll(hub, "bob")
    bob_api = httpx.Client(base_url=f"{hub.url}/api/v1", headers={"Authorization": f"Bearer {bob['token']}"})

    stub = Stub(client_env(hub, home), str(REPO))  # stands for the gemini process
    try:
        started = stub.hook(line, gemini_event("SessionStart", source="startup"))
        assert REGISTERED.search(started["answer"]["hookSpecificOutput"]["additionalContext"])
        bob_api.post("messages", json={"to": "frontend", "message": "The API moved to /v2."})
        tool = stub.hook(
            line,
            gemini_event(
                "AfterTool",
                tool_name="read_file",
                tool_input={"absolute_path": "/work/frontend/api.ts"},
                tool_response={"llmContent": "export const API = '/v1'", "returnDisplay": "api.ts"},
            ),
        )
        assert "The API moved to /v2." in tool["answer"]["hookSpecificOutput"]["additionalContext"]

        bob_api.post("messages", json={"to": "frontend", "message": "Also bump the client."})
        kept = stub.hook(
            line,
            gemini_event("AfterAgent", prompt="fix it", prompt_response="Fixed.", stop_hook_active=False),
        )
        assert kept["answer"]["decision"] == "deny" and "Also bump the client." in kept["answer"]["reason"]
        done = stub.hook(
            line,
            gemini_event(
                "AfterAgent", prompt="fix it", prompt_response="Moved to /v2.", stop_hook_active=True
            ),
        )
        assert done["answer"] is None
        assert agents(hub, bob["token"])["frontend"]["status"] == "idle"

        # Its MCP server (same gemini process) acts as the same session.
        mcp_env = {**server["env"]}
        assert stub.send(op="mcp_start", argv=[server["command"], *server["args"]], env=mcp_env) == {
            "ok": True
        }
        sent = stub.send(op="mcp_call", tool="send_message", args={"to": "bob", "message": "Done, see /v2."})
        assert not sent["is_error"], sent
        pulled = bob_api.get("inbox").json()["messages"]
        assert [m["from"]["name"] for m in pulled] == ["frontend"]

        prompt = stub.hook(line, gemini_event("BeforeAgent", prompt="next: tests"))
        assert prompt["code"] == 0
        assert agents(hub, bob["token"])["frontend"]["status"] == "busy"
        stub.hook(line, gemini_event("SessionEnd", reason="exit"))
        everyone = agents(hub, bob["token"])
        assert everyone["frontend"]["status"] == "exited" and everyone["frontend"]["kind"] == "gemini-cli"
    finally:
        stub.close()


# --- Codex CLI ----------------------------------------------------------------------------------
CODEX_USER_CONFIG = """\
# my Codex settings
model = "gpt-5-codex"

[mcp_servers.docs]
command = "docs-mcp"  # keeps its comment
args = ["--stdio"]

[[hooks.PostToolUse]]
matcher = "^Bash$"

[[hooks.PostToolUse.hooks]]
type = "command"
command = "./audit.sh"

[hooks.state."config.toml:post_tool_use:0:0"]
trusted_hash = "sha256:0123"
"""
# codex-rs hook_config.rs; Interrupt: a turn its user ends with Esc (tests/clients/test_codex.py)
CODEX_EVENTS = {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "Interrupt"}
CODEX_SHELL = ["bash", "-lc"]  # codex-rs hooks command_runner.rs: `$SHELL -lc <command>`


def ours(config: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [
        h
        for group in config["hooks"][event]
        for h in group["hooks"]
        if shlex.split(h["command"])[-4:-2] == ["--client", "codex"]
    ]


def test_codex_install_merges_config_toml_keeping_the_user_s(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CODEX_USER_CONFIG)

    assert install_cli(tmp_path, "--client", "codex") == 0
    once = config.read_text()
    assert install_cli(tmp_path, "--client", "codex") == 0

    text = config.read_text()
    assert text == once  # twice: the same file, byte for byte
    parsed = tomllib.loads(text)
    assert "# my Codex settings" in text and "# keeps its comment" in text
    assert parsed["model"] == "gpt-5-codex" and parsed["mcp_servers"]["docs"]["args"] == ["--stdio"]
    server = parsed["mcp_servers"]["switchboard"]
    assert server["args"][-1] == "mcp"
    assert server["env"] == {
        "SWITCHBOARD_URL": "http://127.0.0.1:9123",
        "SWITCHBOARD_ATTACH": "hooks",
        "SWITCHBOARD_CLIENT": "codex",
    }
    # Codex 0.171 `codex exec` sends the first model request without waiting for a server that is
    # not required: the Switchboard tools would be missing from it (tests/clients/test_codex.py).
    assert server["required"] is True
    assert set(parsed["hooks"]) == CODEX_EVENTS | {"state"}
    for event in CODEX_EVENTS:
        [entry] = ours(parsed, event)
        assert entry["type"] == "command" and entry["timeout"] == 10  # Codex's timeouts are in seconds
        assert shlex.split(entry["command"])[-2:] == ["--url", "http://127.0.0.1:9123"]
    assert [g.get("matcher") for g in parsed["hooks"]["PostToolUse"]] == ["^Bash$", "*"]
    assert parsed["hooks"]["PostToolUse"][0]["hooks"] == [{"type": "command", "command": "./audit.sh"}]
    assert parsed["hooks"]["state"] == {"config.toml:post_tool_use:0:0": {"trusted_hash": "sha256:0123"}}
    assert "notify" not in parsed


def test_codex_install_over_an_earlier_one_adds_the_interrupt_hook_once(tmp_path: Path) -> None:
    """A config.toml an install wrote before Switchboard had an Interrupt hook: installing again
    adds it, and our entry of every other event stays the one entry (the user's too)."""
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CODEX_USER_CONFIG)
    assert install_cli(tmp_path, "--client", "codex") == 0
    earlier = tomlkit.parse(config.read_text())
    del earlier["hooks"]["Interrupt"]
    config.write_text(tomlkit.dumps(earlier))

    assert install_cli(tmp_path, "--client", "codex") == 0
    once = config.read_text()
    assert install_cli(tmp_path, "--client", "codex") == 0

    assert config.read_text() == once
    parsed = tomllib.loads(once)
    assert set(parsed["hooks"]) == CODEX_EVENTS | {"state"}
    assert all(len(ours(parsed, event)) == 1 for event in CODEX_EVENTS)
    assert parsed["hooks"]["PostToolUse"][0]["hooks"] == [{"type": "command", "command": "./audit.sh"}]


def test_codex_install_keeps_a_notify_program_the_user_has(tmp_path: Path, monkeypatch, capsys) -> None:
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('notify = ["notify-send", "Codex"]\n')

    assert install_cli(tmp_path, "--client", "codex") == 0

    assert tomllib.loads(config.read_text())["notify"] == ["notify-send", "Codex"]
    assert "it was kept" in capsys.readouterr().out


def test_codex_install_removes_the_notify_program_an_earlier_install_wrote(tmp_path: Path) -> None:
    """Before Codex had hooks, Switchboard reported idle through `notify`; the Stop hook does now."""
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    old = ["/opt/sb/bin/switchboard", "hook", "--client", "codex", "--url", "http://127.0.0.1:8765"]
    config.write_text(f"notify = {json.dumps(old)}\n")

    assert install_cli(tmp_path, "--client", "codex") == 0

    assert "notify" not in tomllib.loads(config.read_text())


def test_a_new_codex_config_is_its_owner_s_alone(tmp_path: Path) -> None:
    assert install_cli(tmp_path, "--client", "codex") == 0
    assert stat.S_IMODE((tmp_path / ".codex" / "config.toml").stat().st_mode) == 0o600


@pytest.mark.e2e
def test_a_codex_session_through_the_written_hooks_and_mcp_server(
    hub_process: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = hub_process
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("SWITCHBOARD_URL", hub.url)
    monkeypatch.setenv("SWITCHBOARD_NAME", "codex-api")
    assert install_cli(tmp_path, "--client", "codex") == 0
    parsed = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    server = parsed["mcp_servers"]["switchboard"]
    line = ours(parsed, "Stop")[0]["command"]
    bob = enroll(hub, "bob")
    bob_api = httpx.Client(base_url=f"{hub.url}/api/v1", headers={"Authorization": f"Bearer {bob['token']}"})
    thread = "019d036d-0000-7000-8000-00000000a001"

    env = client_env(hub, home) | {"SWITCHBOARD_NAME": "codex-api"}
    stub = Stub(env, str(REPO))  # stands for the codex process
    try:
        # Codex starts its MCP servers and runs SessionStart as the thread starts: one hub session.
        assert stub.send(op="mcp_start", argv=[server["command"], *server["args"]], env=server["env"]) == {
            "ok": True
        }
        started = stub.hook(line, codex_event("SessionStart", thread, source="startup"), shell=CODEX_SHELL)
        name, ref = REGISTERED.search(started["answer"]["hookSpecificOutput"]["additionalContext"]).groups()
        assert (name, agents(hub, bob["token"])["codex-api"]["ref"]) == ("codex-api", ref)

        bob_api.post("messages", json={"to": "codex-api", "message": "The build needs --locked."})
        tool = stub.hook(
            line,
            codex_event(
                "PostToolUse",
                thread,
                tool_name="Bash",
                tool_input={"command": "cargo build"},
                tool_response="Finished dev profile",
                tool_use_id="call_01",
            ),
            shell=CODEX_SHELL,
        )
        injected = tool["answer"]["hookSpecificOutput"]
        assert injected["hookEventName"] == "PostToolUse"
        assert "The build needs --locked." in injected["additionalContext"]

        bob_api.post("messages", json={"to": "codex-api", "message": "And run the tests."})
        stop = codex_event("Stop", thread, stop_hook_active=False, last_assistant_message="Built.")
        kept = stub.hook(line, stop, shell=CODEX_SHELL)
        assert kept["answer"]["decision"] == "block" and "And run the tests." in kept["answer"]["reason"]
        final = "Built with --locked; tests pass."
        done = stub.hook(
            line, stop | {"stop_hook_active": True, "last_assistant_message": final}, shell=CODEX_SHELL
        )
        assert done["answer"] is None
        assert agents(hub, bob["token"])["codex-api"]["status"] == "idle"

        # A turn its user interrupts (Esc) runs Interrupt, not Stop: idle again, no final answer.
        stub.hook(line, codex_event("UserPromptSubmit", thread, prompt="Now the docs."), shell=CODEX_SHELL)
        assert agents(hub, bob["token"])["codex-api"]["status"] == "busy"
        interrupted = stub.hook(
            ours(parsed, "Interrupt")[0]["command"], codex_event("Interrupt", thread), shell=CODEX_SHELL
        )
        assert interrupted["answer"] is None
        assert agents(hub, bob["token"])["codex-api"]["status"] == "idle"

        # /clear starts a new thread in the same Codex process: the same hub session carries on.
        cleared = stub.hook(
            line,
            codex_event("SessionStart", "019d036d-0000-7000-8000-00000000a002", source="clear"),
            shell=CODEX_SHELL,
        )
        assert REGISTERED.search(cleared["answer"]["hookSpecificOutput"]["additionalContext"]).group(2) == ref
        sent = stub.send(op="mcp_call", tool="send_message", args={"to": "bob", "message": "Done."})
        assert not sent["is_error"], sent
        assert [m["from"]["ref"] for m in bob_api.get("inbox").json()["messages"]] == [ref]
        assert len([a for a in agents(hub, bob["token"]).values() if a["kind"] == "codex"]) == 1
    finally:
        stub.close()
    assert agents(hub, bob["token"])["codex-api"]["status"] == "exited"  # its MCP server ended it
    assert not list((home / "sessions").glob("*.json"))


@pytest.mark.e2e
def test_a_notify_program_from_an_earlier_install_still_reports_idle(
    hub_process: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = hub_process
    home = tmp_path / "agent-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("SWITCHBOARD_URL", hub.url)
    server = mcp_config(url=hub.url, client="codex")["mcpServers"]["switchboard"]
    bob = enroll(hub, "bob")

    stub = Stub(client_env(hub, home) | {"SWITCHBOARD_NAME": "codex-api"}, str(REPO))
    try:
        assert stub.send(op="mcp_start", argv=[server["command"], *server["args"]], env=server["env"]) == {
            "ok": True
        }
        # Codex's MCP server registers its process's session as Codex starts: idle at the prompt.
        assert agents(hub, bob["token"])["codex-api"]["status"] == "idle"
        # A turn under way (with no hooks installed, nothing else reports it): busy.
        busy = stub.send(op="mcp_call", tool="set_status", args={"status": "busy"})
        assert not busy["is_error"] and agents(hub, bob["token"])["codex-api"]["status"] == "busy", busy
        # Codex's notify after a turn: argv plus the JSON (codex-rs legacy notify) as the last argument.
        turn = {
            "type": "agent-turn-complete",
            "thread-id": "b5f6c1c2-1111-2222-3333-444455556666",
            "turn-id": "12345",
            "cwd": "/work/api",
            "client": "codex-tui",
            "input-messages": ["Rename `foo` to `bar` and update the callsites."],
            "last-assistant-message": "Rename complete and verified `cargo build` succeeds.",
        }
        notified = stub.send(
            op="notify", argv=hook_argv("codex", url=hub.url), payload=json.dumps(turn), env={}
        )
        assert notified["code"] == 0
        row = agents(hub, bob["token"])["codex-api"]
        assert row["status"] == "idle" and row["kind"] == "codex", (home / "agent.log").read_text()
    finally:
        stub.close()
    assert agents(hub, bob["token"])["codex-api"]["status"] == "exited"  # its MCP server ended it
    assert not list((home / "sessions").glob("*.json"))


# --- Approving the Switchboard tools ------------------------------------------------------------
# Each client's settings file as its user had it, approving tools of another server of theirs.
USER_FILES: dict[str, tuple[str, str]] = {
    "claude": (
        ".claude/settings.json",
        json.dumps(
            {
                "model": "opus",
                "permissions": {
                    "allow": ["Bash(npm test)", "mcp__github"],
                    "deny": ["mcp__switchboard__ack"],
                    "defaultMode": "default",
                },
                "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "./notify.sh"}]}]},
            },
            indent=2,
        ),
    ),
    "codex": (
        ".codex/config.toml",
        CODEX_USER_CONFIG.replace(
            'args = ["--stdio"]\n', 'args = ["--stdio"]\ndefault_tools_approval_mode = "approve"\n'
        ),
    ),
    "gemini": (
        ".gemini/settings.json",
        json.dumps({**GEMINI_USER_SETTINGS, "mcpServers": {"github": {"command": "gh-mcp", "trust": True}}}),
    ),
}
# Every MCP server's approval in each file once installed: the user's, and ours (only ours).
APPROVED: dict[str, Any] = {
    "claude": ["Bash(npm test)", "mcp__github", "mcp__switchboard"],
    "codex": {"docs": "approve", "switchboard": "approve"},
    "gemini": {"github": True, "switchboard": True},
}


def user_files(project: Path, client: str) -> Path:
    """The client's settings file in `project`, as its user had it."""
    name, text = USER_FILES[client]
    path = project / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def approvals(client: str, path: Path) -> Any:
    """What `path` approves: Claude Code's allow rules; each server's approval for Codex and Gemini."""
    if client == "claude":
        return json.loads(path.read_text()).get("permissions", {}).get("allow")
    if client == "codex":
        servers = tomllib.loads(path.read_text())["mcp_servers"]
        return {name: server.get("default_tools_approval_mode") for name, server in servers.items()}
    servers = json.loads(path.read_text())["mcpServers"]
    return {name: server.get("trust") for name, server in servers.items()}


@pytest.mark.parametrize("client", ["claude", "codex", "gemini"])
def test_install_approves_the_switchboard_tools_and_no_others_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    path = user_files(tmp_path, client)

    assert install_cli(tmp_path, "--client", client) == 0
    once = path.read_text()
    assert install_cli(tmp_path, "--client", client) == 0

    assert path.read_text() == once  # idempotent
    assert approvals(client, path) == APPROVED[client]
    if client == "claude":  # the user's other permissions and hooks, as they were
        settings = json.loads(once)
        assert settings["model"] == "opus"
        assert settings["permissions"]["deny"] == ["mcp__switchboard__ack"]
        assert settings["permissions"]["defaultMode"] == "default"
        assert settings["hooks"]["Stop"][0]["hooks"] == [{"type": "command", "command": "./notify.sh"}]
        # The MCP server's own file approves nothing: Claude Code reads allow rules from settings.
        assert set(json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]["switchboard"]) == {
            "command",
            "args",
            "env",
        }
    if client == "codex":
        assert "# my Codex settings" in once and "# keeps its comment" in once


@pytest.mark.parametrize("client", ["claude", "codex", "gemini"])
def test_ask_before_tools_removes_exactly_the_approval_install_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """Installed, then installed again with --ask-before-tools: the file is the one a first
    install with --ask-before-tools writes, the user's own approvals in it."""
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    asked_first, approved_first = tmp_path / "asked", tmp_path / "approved"
    for project in (asked_first, approved_first):
        user_files(project, client)
    assert install_cli(approved_first, "--client", client) == 0

    assert install_cli(approved_first, "--client", client, "--ask-before-tools") == 0
    assert install_cli(asked_first, "--client", client, "--ask-before-tools") == 0

    name = USER_FILES[client][0]
    assert (approved_first / name).read_text() == (asked_first / name).read_text()
    left = approvals(client, approved_first / name)
    if client == "claude":
        assert left == ["Bash(npm test)", "mcp__github"]
    else:
        assert left == {**APPROVED[client], "switchboard": None}


def test_ask_before_tools_leaves_a_claude_settings_file_without_permissions_as_it_found_it(
    tmp_path: Path,
) -> None:
    assert install_cli(tmp_path) == 0
    assert json.loads((tmp_path / ".claude" / "settings.json").read_text())["permissions"] == {
        "allow": ["mcp__switchboard"]
    }

    assert install_cli(tmp_path, "--ask-before-tools") == 0

    assert set(json.loads((tmp_path / ".claude" / "settings.json").read_text())) == {"hooks"}


CODEX_SERVER_TUNED = """\
[mcp_servers.switchboard]
# the user's note on our server
command = "/old/venv/bin/switchboard"
args = ["mcp"]
startup_timeout_sec = 30
default_tools_approval_mode = "prompt"

[mcp_servers.switchboard.tools.send_message]
approval_mode = "prompt"
"""


def test_codex_install_keeps_what_the_user_set_in_the_switchboard_server_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our keys are set in the table; the user's (a timeout, a per-tool approval, a comment) stay,
    and with --ask-before-tools an approval mode of theirs that asks stays too."""
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CODEX_SERVER_TUNED)

    assert install_cli(tmp_path, "--client", "codex", "--ask-before-tools") == 0
    asked = tomllib.loads(config.read_text())["mcp_servers"]["switchboard"]
    assert install_cli(tmp_path, "--client", "codex") == 0
    approved = tomllib.loads(config.read_text())["mcp_servers"]["switchboard"]

    assert asked["default_tools_approval_mode"] == "prompt"
    assert approved["default_tools_approval_mode"] == "approve"
    for server in (asked, approved):
        assert server["command"] != "/old/venv/bin/switchboard" and server["required"] is True
        assert server["startup_timeout_sec"] == 30
        assert server["tools"] == {"send_message": {"approval_mode": "prompt"}}
    assert "# the user's note on our server" in config.read_text()


@pytest.mark.parametrize(
    ("client", "entry"),
    [
        ("claude", '"mcp__switchboard" in permissions.allow'),
        ("codex", 'default_tools_approval_mode = "approve" in [mcp_servers.switchboard]'),
        ("gemini", "trust = true in mcpServers.switchboard"),
    ],
)
def test_install_says_what_it_approved_and_how_to_undo_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    client: str,
    entry: str,
) -> None:
    monkeypatch.setenv("SWITCHBOARD_URL", "http://127.0.0.1:9123")
    assert install_cli(tmp_path, "--client", client) == 0
    approved = " ".join(capsys.readouterr().out.split())
    assert install_cli(tmp_path, "--client", client, "--ask-before-tools") == 0
    asked = " ".join(capsys.readouterr().out.split())

    assert f"Approved the tools of the switchboard MCP server, and no other server's: {entry}" in approved
    undo = (
        f"switchboard install-hooks --client {client} --scope project --project-dir {tmp_path} "
        "--url http://127.0.0.1:9123"
    )
    assert f"{undo} --ask-before-tools --write" in approved
    assert f"approval to {CLIENT_NAMES[client]}: no {entry}" in asked
    assert f"To approve them: {undo} --write" in asked
    # Claude Code 2.1.332 drops a shared .claude/settings.json's allow rules in a folder not trusted.
    assert ("only in a folder you have trusted" in approved) is (client == "claude")
