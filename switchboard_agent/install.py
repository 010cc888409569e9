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
  `[[hooks.Stop.hooks]]` handlers: SessionStart, UserPromptSubmit, PostToolUse, Stop, Interrupt;
  `timeout` in seconds). Codex asks its user to review and trust new hooks (`/hooks`) before they run. A
  `notify` program an earlier install wrote is removed (the Stop hook reports idle now); the user's
  own is kept.

In the same file, the tools of Switchboard's own MCP server (no other server's) are approved, so the
model calls them without the client asking, in `claude -p`, `codex exec` and `gemini -p` too:
Claude Code's `permissions.allow` rule `mcp__switchboard`, Codex's `default_tools_approval_mode =
"approve"` and Gemini's `"trust": true` on the server. With `approve_tools=False` (`--ask-before-tools`)
the client decides, and an approval an earlier install wrote is removed. The folder and hook trust
each client asks its user for stays the user's.
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
# The name every client's config gives Switchboard's MCP server; each client names the server's tools
# and its approvals by it.
MCP_SERVER = "switchboard"
# Claude Code 2.1.332: an allow rule naming a server (`mcp__<server>`, no tool) matches each of its tools.
CLAUDE_TOOLS_RULE = f"mcp__{MCP_SERVER}"
# The key and value in a client's own entry for the server that approve all of its tools: Codex
# 0.171 `McpServerConfig.default_tools_approval_mode` (`auto`, `prompt`, `approve`), Gemini CLI 0.61
# `MCPServerConfig.trust` (in a trusted folder: no confirmation for the server's tools).
SERVER_APPROVAL: dict[str, tuple[str, Any]] = {
    "codex": ("default_tools_approval_mode", "approve"),
    "gemini": ("trust", True),
}
CLIENT_NAMES = {"claude": "Claude Code", "codex": "Codex", "gemini": "Gemini CLI"}
CLIENT_RUNS = {"claude": "claude -p", "codex": "codex exec", "gemini": "gemini -p"}  # runs that cannot ask
HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd")
GEMINI_EVENTS = ("SessionStart", "BeforeAgent", "AfterTool", "AfterAgent", "SessionEnd")
# No SessionEnd for Codex: its MCP server ends the session as Codex stops it. Interrupt: a turn its
# user ends with Esc runs it instead of Stop.
CODEX_EVENTS = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "Interrupt")
# What a Gemini CLI user still does (checked against 0.61): the folder's trust is not ours to decide.
GEMINI_NEXT = (
    "Gemini CLI runs these only in a trusted folder: trust it when Gemini asks on its first start "
    "there (gemini -p in a folder not trusted yet exits; --skip-trust runs it once)."
)
# Claude Code 2.1.332 drops the allow rules of a project's shared `.claude/settings.json` in a folder
# its user has not trusted ("workspace not yet trusted", in its debug log): the trust is the user's.
CLAUDE_PROJECT_TRUST = (
    "Claude Code applies the allow rule in this project's .claude/settings.json only in a folder you "
    "have trusted (its trust dialog, on the first interactive start there); claude -p in a folder "
    "never trusted refuses the tools."
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
    return {"mcpServers": {MCP_SERVER: {"command": parts[0], "args": [*parts[1:], "mcp"], "env": env}}}


def approve_server(entry: Any, client: str, approve: bool) -> None:
    """Set, in `entry` (the client's own entry for our server: a dict, or a tomlkit table), the key
    that approves all of the server's tools; without `approve`, remove it where it holds our value
    (a value the user chose that asks, such as Codex's `prompt`, is theirs)."""
    key, value = SERVER_APPROVAL[client]
    if approve:
        entry[key] = value
    elif key in entry and entry[key] == value:
        del entry[key]


def merge_server(servers: dict[str, Any], entry: dict[str, Any], client: str, approve: bool) -> None:
    """Our server's entry in a JSON `mcpServers` object, its keys set and the user's other keys in it
    kept; its tools approved (or not) as `approve` says, where the client approves in that entry."""
    current = servers.get(MCP_SERVER)
    merged = {**(current if isinstance(current, dict) else {}), **entry}
    if client in SERVER_APPROVAL:
        approve_server(merged, client, approve)
    servers[MCP_SERVER] = merged


def merge_claude_approval(settings: dict[str, Any], approve: bool) -> dict[str, Any]:
    """Claude Code `settings` with our allow rule in `permissions.allow` once (the user's rules and
    their order kept), or without it; a `permissions` left empty by removing it goes too."""
    merged = dict(settings)
    permissions = dict(merged.get("permissions") or {})
    allow = list(permissions.get("allow") or [])
    if approve and CLAUDE_TOOLS_RULE not in allow:
        permissions["allow"] = [*allow, CLAUDE_TOOLS_RULE]
    elif not approve and CLAUDE_TOOLS_RULE in allow:
        allow = [rule for rule in allow if rule != CLAUDE_TOOLS_RULE]
        if allow:
            permissions["allow"] = allow
        else:
            del permissions["allow"]
    else:
        return merged
    if permissions:
        merged["permissions"] = permissions
    else:
        merged.pop("permissions", None)
    return merged


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


def merge_codex(
    text: str, *, mcp: dict[str, Any], hooks: dict[str, Any], approve: bool = True
) -> tuple[str, str | None]:
    """Codex's config.toml text with `[mcp_servers.switchboard]` (its tools approved, or not, as
    `approve` says) and our `[hooks]` entries set, comments and everything else kept (tomlkit
    round-trips the file; keys of the user's own in our server's table, such as per-tool
    `tools.<name>.approval_mode`, stay; `[hooks.state]`, where Codex records which hooks its user
    trusted, is left to Codex). A `notify` program an earlier install wrote is removed. Returns the
    text and, when the user runs a notify program of their own, a sentence saying it was kept."""
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
    server = servers.get(MCP_SERVER)
    if not isinstance(server, dict):  # tomlkit's tables and inline tables are dicts
        server = tomlkit.table()
        servers[MCP_SERVER] = server
    server["command"] = mcp["command"]
    server["args"] = mcp["args"]
    env = tomlkit.inline_table()
    env.update(mcp["env"])
    server["env"] = env
    # `codex exec` sends its first model request without waiting for a server that is not
    # required (Codex 0.171): the Switchboard tools would be missing from the first turn.
    server["required"] = True
    approve_server(server, "codex", approve)
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


def approval_entry(client: str) -> str:
    """The entry in the client's settings file that approves our tools, as its config spells it."""
    if client == "claude":
        return f'"{CLAUDE_TOOLS_RULE}" in permissions.allow'
    key, value = SERVER_APPROVAL[client]
    table = f"[mcp_servers.{MCP_SERVER}]" if client == "codex" else f"mcpServers.{MCP_SERVER}"
    return f"{key} = {json.dumps(value)} in {table}"


def undo_line(client: str, scope: str, project_dir: Path, url: str, approve: bool) -> str:
    """The command that writes the same files with the other choice about our tools' approval."""
    words = ["switchboard", "install-hooks", "--client", client, "--scope", scope]
    if scope != "user":
        words += ["--project-dir", str(project_dir)]
    return shlex.join([*words, "--url", url, *(["--ask-before-tools"] if approve else []), "--write"])


def install(
    *,
    scope: str,
    project_dir: Path,
    write: bool,
    client: str = "claude",
    url: str | None = None,
    approve_tools: bool = True,
) -> dict[str, Any]:
    """What to install where for `client`; with `write`, merge it into the files. With
    `approve_tools`, the settings file also approves the tools of our MCP server (only those);
    without, it approves none of them and an approval an earlier install wrote is removed. Returns
    a report."""
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
        "approve_tools": approve_tools,
        "approval": approval_entry(client),
        "undo": undo_line(client, scope, project_dir, url, approve_tools),
    }
    if client == "codex":
        hooks = hooks_settings(url=url, client="codex")
        report["hooks"] = hooks
        current = settings_file.read_text(encoding="utf-8") if settings_file.exists() else ""
        text, warning = merge_codex(
            current, mcp=mcp["mcpServers"][MCP_SERVER], hooks=hooks, approve=approve_tools
        )
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
            servers = current.setdefault("mcpServers", {})
            merge_server(servers, mcp["mcpServers"][MCP_SERVER], client, approve_tools)
            write_json(settings_file, current)
        return report
    hooks = hooks_settings(url=url)
    report["hooks"] = hooks
    if scope == "project":
        report["mcp_file"] = str(project_dir / ".mcp.json")
    else:
        server = mcp["mcpServers"][MCP_SERVER]
        env = " ".join(f"-e {k}={v}" for k, v in server["env"].items())
        report["mcp_command"] = (
            f"claude mcp add --scope {scope} {env} {MCP_SERVER} -- {server['command']} {' '.join(server['args'])}"
        )
    if write:
        settings = merge_hooks(read_json(settings_file), hooks)
        write_json(settings_file, merge_claude_approval(settings, approve_tools))
        if scope == "project":
            mcp_file = project_dir / ".mcp.json"
            current = read_json(mcp_file)
            merge_server(
                current.setdefault("mcpServers", {}), mcp["mcpServers"][MCP_SERVER], client, approve_tools
            )
            write_json(mcp_file, current)
    return report


def show_approval(report: dict[str, Any], *, written: bool) -> str:
    """What the settings file says of our tools' approval, and the command for the other choice."""
    client, where = CLIENT_NAMES[report["client"]], f"{report['approval']} ({report['settings_file']})"
    if not report["approve_tools"]:
        return (
            f"{'Left' if written else 'Leave'} the {MCP_SERVER} tools' approval to {client}: no {where}. "
            f"It asks before each call, and a run that cannot ask ({CLIENT_RUNS[report['client']]}) "
            f"cannot use them.\nTo approve them: {report['undo']}"
        )
    said = (
        f"{'Approved' if written else 'Approve'} the tools of the {MCP_SERVER} MCP server, and no "
        f"other server's: {where}. {client} runs them without asking."
    )
    if (report["client"], report["scope"]) == ("claude", "project"):
        said += f" {CLAUDE_PROJECT_TRUST}"
    return f"{said}\nTo have {client} ask before each call instead: {report['undo']}"


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
    lines.append("\n" + show_approval(report, written=written))
    if not written:
        lines.append("\n(Nothing was written; pass --write to merge these into the files.)")
    return "\n".join(lines)
