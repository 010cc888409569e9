"""`switchboard install-hooks`: the Claude Code settings that run `switchboard hook` on each event,
and the MCP server config, printed or merged into the settings files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from console.agent.config import hub_url
from console.home import write_private

HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd")
HOOK_TIMEOUT_SECONDS = 10


def switchboard_command() -> list[str]:
    """How to run this switchboard from any folder: the installed script, else this interpreter."""
    beside = Path(sys.executable).parent / "switchboard"  # the venv's script, even when not on PATH
    found = str(beside) if beside.exists() else shutil.which("switchboard")
    if found:
        return [found]
    return [sys.executable, "-m", "console.cli"]


def hooks_settings(command: list[str] | None = None) -> dict[str, Any]:
    """The `hooks` block for .claude/settings.json."""
    line = " ".join(_quote(part) for part in (command or switchboard_command())) + " hook"
    entry = {"type": "command", "command": line, "timeout": HOOK_TIMEOUT_SECONDS}
    hooks: dict[str, Any] = {}
    for event in HOOK_EVENTS:
        group: dict[str, Any] = {"hooks": [entry]}
        if event == "PostToolUse":
            group = {"matcher": "*", **group}
        hooks[event] = [group]
    return {"hooks": hooks}


def mcp_config(command: list[str] | None = None, url: str | None = None) -> dict[str, Any]:
    """The `mcpServers` entry (project `.mcp.json`, or any MCP client's config). With the hooks
    installed, the server attaches to the session the hooks registered (SWITCHBOARD_ATTACH=hooks)."""
    parts = command or switchboard_command()
    return {
        "mcpServers": {
            "switchboard": {
                "command": parts[0],
                "args": [*parts[1:], "mcp"],
                "env": {"SWITCHBOARD_URL": url or hub_url(), "SWITCHBOARD_ATTACH": "hooks"},
            }
        }
    }


def merge_hooks(existing: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """`existing` settings with our hook entries added once per event; everything else kept."""
    merged = dict(existing)
    hooks = dict(merged.get("hooks") or {})
    for event, groups in wanted["hooks"].items():
        current = list(hooks.get(event) or [])
        command = groups[0]["hooks"][0]["command"]
        present = any(h.get("command") == command for g in current for h in g.get("hooks", []))
        if not present:
            current.extend(groups)
        hooks[event] = current
    merged["hooks"] = hooks
    return merged


def settings_path(scope: str, project_dir: Path) -> Path:
    """Claude Code's settings file for a scope: user (all projects), project (shared through version
    control), local (this project, this machine only: the commands hold absolute paths)."""
    if scope == "user":
        return Path.home() / ".claude" / "settings.json"
    if scope == "local":
        return project_dir / ".claude" / "settings.local.json"
    return project_dir / ".claude" / "settings.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a Claude Code settings file: one this creates is its owner's alone (0600), like every
    file the hub writes; one that exists keeps the mode its user gave it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2) + "\n"
    if path.exists():
        path.write_text(text, encoding="utf-8")
    else:
        write_private(path, text)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object.")
    return data


def install(*, scope: str, project_dir: Path, write: bool) -> dict[str, Any]:
    """What to install where; with `write`, merge it into the files. Returns a report."""
    settings_file = settings_path(scope, project_dir)
    hooks = hooks_settings()
    mcp = mcp_config()
    report: dict[str, Any] = {"scope": scope, "settings_file": str(settings_file), "hooks": hooks, "mcp": mcp}
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


def _quote(part: str) -> str:
    import shlex

    return shlex.quote(part)
