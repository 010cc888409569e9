"""`switchboard install-hooks --client claude|codex|gemini`: each agent client's own config that runs
`switchboard hook` on its events and `switchboard mcp` as its MCP server, printed or merged into the
client's files (everything the user had there is kept).

Every hook line names the hub (`--url`), the same one as the MCP server's `SWITCHBOARD_URL`, so the
hooks and the tools of one agent always reach the same hub.

- Claude Code: `.claude/settings.json` `hooks` (SessionStart, UserPromptSubmit, PostToolUse, Stop,
  SessionEnd; `timeout` in seconds) and `.mcp.json` `mcpServers` (or `claude mcp add` outside a
  project).
- Gemini CLI (docs/hooks/reference.md, docs/reference/configuration.md): `.gemini/settings.json`
  (`~/.gemini/settings.json` for the user) `hooks` (SessionStart, BeforeAgent, AfterTool,
  AfterAgent, SessionEnd; `timeout` in milliseconds) and `mcpServers`.
- Codex CLI (codex-rs/config/src/hook_config.rs, codex-rs/hooks): `config.toml` (`$CODEX_HOME`,
  default `~/.codex`, for the user; `.codex/config.toml` in a trusted project)
  `[mcp_servers.switchboard]` and inline `[hooks]` tables (`[[hooks.Stop]]` groups, each with
  `[[hooks.Stop.hooks]]` handlers: SessionStart, UserPromptSubmit, PostToolUse, Stop; `timeout` in
  seconds). Codex asks its user to review and trust new hooks (`/hooks`) before they run. A
  `notify` program an earlier install wrote is removed (the Stop hook reports idle now); the user's
  own is kept.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from switchboard_agent.config import hub_url
from switchboard_agent.home import write_private

CLIENTS = ("claude", "codex", "gemini")
HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd")
GEMINI_EVENTS = ("SessionStart", "BeforeAgent", "AfterTool", "AfterAgent", "SessionEnd")
# No SessionEnd for Codex: its MCP server ends the session as Codex stops it.
CODEX_EVENTS = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop")
# What a Gemini CLI user still does (checked against 0.61): nothing of it is ours to decide.
GEMINI_NEXT = (
    "Gemini CLI runs these only in a trusted folder: trust it when Gemini asks on its first start "
    "there (gemini -p in a folder not trusted yet exits; --skip-trust runs it once). In -p mode "
    'Gemini offers the model no tool that asks for approval: give --yolo, or set "trust": true '
    "on the switchboard server."
)
HOOK_TIMEOUT_SECONDS = 10  # the client's own limit; the hook itself ends within hooks.HOOK_DEADLINE


def switchboard_command() -> list[str]:
    """How to run this switchboard from any folder: the installed script, else this interpreter."""
    beside = Path(sys.executable).parent / "switchboard"  # the venv's script, even when not on PATH
    found = str(beside) if beside.exists() else shutil.which("switchboard")
    if found:
        return [found]
    return [sys.executable, "-m", "switchboard_agent.cli"]


def hook_argv(client: str = "claude", command: list[str] | None = None, url: str | None = None) -> list[str]:
    """The hook's command line as words: `switchboard hook [--client X] --url URL`."""
    words = [*(command or switchboard_command()), "hook"]
    if client != "claude":
        words += ["--client", client]
    return [*words, "--url", url or hub_url()]


def hook_line(client: str = "claude", command: list[str] | None = None, url: str | None = None) -> str:
    return shlex.join(hook_argv(client, command, url))


def hooks_settings(
    command: list[str] | None = None, url: str | None = None, client: str = "claude"
) -> dict[str, Any]:
    """The `hooks` block for .claude/settings.json (or, with `client="codex"`, the same shape for
    Codex's `[hooks]` tables): one command entry per event, every tool for PostToolUse."""
    entry = {"type": "command", "command": hook_line(client, command, url), "timeout": HOOK_TIMEOUT_SECONDS}
    hooks: dict[str, Any] = {}
    for event in CODEX_EVENTS if client == "codex" else HOOK_EVENTS:
        group: dict[str, Any] = {"hooks": [entry]}
        if event == "PostToolUse":
            group = {"matcher": "*", **group}
        hooks[event] = [group]
    return {"hooks": hooks}


def gemini_hooks(command: list[str] | None = None, url: str | None = None) -> dict[str, Any]:
    """The `hooks` block for Gemini CLI's settings.json (no matcher: every tool, every source).

    Gemini runs the line through `bash -c` and takes any exit code but 0 and 1 as the hook blocking
    the agent: bash's 127 for a `switchboard` that is gone (a moved venv) blocked every prompt
    ("Agent execution blocked: bash: ...: No such file or directory"). `|| true` makes that a
    warning Gemini shows its user; the hook itself always exits 0."""
    entry = {
        "name": "switchboard",
        "type": "command",
        "command": f"{hook_line('gemini', command, url)} || true",
        "timeout": HOOK_TIMEOUT_SECONDS * 1000,
    }
    return {"hooks": {event: [{"hooks": [entry]}] for event in GEMINI_EVENTS}}


def mcp_config(
    command: list[str] | None = None, url: str | None = None, client: str = "claude"
) -> dict[str, Any]:
    """The `mcpServers` entry (project `.mcp.json`, Gemini's settings.json, or any MCP client's
    config). With the hooks installed, the server acts as the session its own client's hooks
    registered (SWITCHBOARD_ATTACH=hooks); for Codex it registers that session itself."""
    parts = command or switchboard_command()
    env = {"SWITCHBOARD_URL": url or hub_url(), "SWITCHBOARD_ATTACH": "hooks", "SWITCHBOARD_CLIENT": client}
    return {"mcpServers": {"switchboard": {"command": parts[0], "args": [*parts[1:], "mcp"], "env": env}}}


def _is_ours(command: str, prefix: str) -> bool:
    return command == prefix or command.startswith(prefix + " ")


def merge_hooks(existing: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """`existing` settings with our hook entry once per event (an earlier Switchboard entry, for
    another hub or an older line, is replaced); everything else kept."""
    merged = dict(existing)
    hooks = dict(merged.get("hooks") or {})
    for event, groups in wanted["hooks"].items():
        command = groups[0]["hooks"][0]["command"]
        prefix = command[: command.index(" hook") + len(" hook")]
        current = []
        for group in hooks.get(event) or []:
            kept = [h for h in group.get("hooks", []) if not _is_ours(str(h.get("command", "")), prefix)]
            if kept or not group.get("hooks"):
                current.append({**group, "hooks": kept})
        hooks[event] = [*current, *groups]
    merged["hooks"] = hooks
    return merged


def settings_path(scope: str, project_dir: Path, client: str = "claude") -> Path:
    """The client's settings file for a scope: user (all projects), project (shared through version
    control), local (Claude Code only: this project, this machine)."""
    if client == "gemini":
        base = Path.home() if scope == "user" else project_dir
        return base / ".gemini" / "settings.json"
    if client == "codex":
        if scope == "user":
            return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex").expanduser() / "config.toml"
        return project_dir / ".codex" / "config.toml"
    if scope == "user":
        return Path.home() / ".claude" / "settings.json"
    if scope == "local":
        return project_dir / ".claude" / "settings.local.json"
    return project_dir / ".claude" / "settings.json"


def write_text(path: Path, text: str) -> None:
    """Write a client's config file: one this creates is its owner's alone (0600), like every file
    the hub writes; one that exists keeps the mode its user gave it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.write_text(text, encoding="utf-8")
    else:
        write_private(path, text)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object.")
    return data


def merge_codex(text: str, *, mcp: dict[str, Any], hooks: dict[str, Any]) -> tuple[str, str | None]:
    """Codex's config.toml text with `[mcp_servers.switchboard]` and our `[hooks]` entries set,
    comments and everything else kept (tomlkit round-trips the file; `[hooks.state]`, where Codex
    records which hooks its user trusted, is left to Codex). A `notify` program an earlier install
    wrote is removed. Returns the text and, when the user runs a notify program of their own, a
    sentence saying it was kept."""
    import tomlkit

    doc = tomlkit.parse(text)
    warning = None
    current = doc.get("notify")
    if isinstance(current, list) and "hook" in current and "codex" in current:
        del doc["notify"]  # ours, from before Codex had hooks: the Stop hook reports idle now
    elif current is not None:
        warning = f"Codex also runs your notify = {json.dumps(list(current))}; it was kept."
    servers = doc.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        doc["mcp_servers"] = servers
    server = tomlkit.table()
    server["command"] = mcp["command"]
    server["args"] = mcp["args"]
    env = tomlkit.inline_table()
    env.update(mcp["env"])
    server["env"] = env
    # `codex exec` sends its first model request without waiting for a server that is not
    # required (Codex 0.171): the Switchboard tools would be missing from the first turn.
    server["required"] = True
    servers["switchboard"] = server
    table = doc.get("hooks")
    if table is None:
        table = tomlkit.table(is_super_table=True)
        doc["hooks"] = table
    merged = merge_hooks({"hooks": table.unwrap()}, hooks)["hooks"]
    for event in hooks["hooks"]:
        current = table.get(event)
        if current is not None and current.unwrap() == merged[event]:
            continue  # left as written: a new array would drop the blank line that ends this one
        groups = tomlkit.aot()
        for group in merged[event]:
            groups.append(tomlkit.item(group))
        table[event] = groups
    return tomlkit.dumps(doc), warning


def install(
    *, scope: str, project_dir: Path, write: bool, client: str = "claude", url: str | None = None
) -> dict[str, Any]:
    """What to install where for `client`; with `write`, merge it into the files. Returns a report."""
    if client not in CLIENTS:
        raise ValueError(f"Unknown client {client!r}: one of {', '.join(CLIENTS)}.")
    if client != "claude" and scope == "local":
        raise ValueError(f"{client} has no local scope: use --scope project or --scope user.")
    url = url or hub_url()
    settings_file = settings_path(scope, project_dir, client)
    mcp = mcp_config(url=url, client=client)
    report: dict[str, Any] = {
        "client": client,
        "scope": scope,
        "settings_file": str(settings_file),
        "mcp": mcp,
    }
    if client == "codex":
        hooks = hooks_settings(url=url, client="codex")
        report["hooks"] = hooks
        current = settings_file.read_text(encoding="utf-8") if settings_file.exists() else ""
        text, warning = merge_codex(current, mcp=mcp["mcpServers"]["switchboard"], hooks=hooks)
        report["config_toml"] = text
        if warning:
            report["warning"] = warning
        if write:
            write_text(settings_file, text)
        return report
    if client == "gemini":
        hooks = gemini_hooks(url=url)
        report["hooks"] = hooks
        if write:
            current = merge_hooks(read_json(settings_file), hooks)
            current.setdefault("mcpServers", {}).update(mcp["mcpServers"])
            write_json(settings_file, current)
        return report
    hooks = hooks_settings(url=url)
    report["hooks"] = hooks
    if scope == "project":
        report["mcp_file"] = str(project_dir / ".mcp.json")
    else:
        server = mcp["mcpServers"]["switchboard"]
        env = " ".join(f"-e {k}={v}" for k, v in server["env"].items())
        report["mcp_command"] = (
            f"claude mcp add --scope {scope} {env} switchboard -- {server['command']} {' '.join(server['args'])}"
        )
    if write:
        write_json(settings_file, merge_hooks(read_json(settings_file), hooks))
        if scope == "project":
            mcp_file = project_dir / ".mcp.json"
            current = read_json(mcp_file)
            current.setdefault("mcpServers", {}).update(mcp["mcpServers"])
            write_json(mcp_file, current)
    return report


def show(report: dict[str, Any], *, written: bool) -> str:
    """The report as the human reads it."""
    verb = "Wrote" if written else "Add"
    lines: list[str] = []
    if report["client"] == "codex":
        lines.append(f"{verb} this to {report['settings_file']}:\n{report['config_toml']}")
        lines.append("Codex runs new hooks once its user has reviewed and trusted them: run /hooks in Codex.")
        if report.get("warning"):
            lines.append(f"Note: {report['warning']}")
    else:
        lines.append(
            f"{verb} these hooks to {report['settings_file']}:\n{json.dumps(report['hooks'], indent=2)}\n"
        )
        if report["client"] == "gemini":
            lines.append(f"{verb} this MCP server to it:\n{json.dumps(report['mcp'], indent=2)}")
            lines.append(GEMINI_NEXT)
        elif "mcp_file" in report:
            lines.append(
                f"{verb} this MCP server to {report['mcp_file']}:\n{json.dumps(report['mcp'], indent=2)}"
            )
        else:
            lines.append(f"Add the MCP server with:\n  {report['mcp_command']}")
    if not written:
        lines.append("\n(Nothing was written; pass --write to merge these into the files.)")
    return "\n".join(lines)
