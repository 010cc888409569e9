"""Each real client under a `$SWITCHBOARD_HOME` another user could write: its agent goes on, and its
user sees why Switchboard is not connected and the command that fixes it.

The hooks refuse such a home (docs/security.md, "The agent side on a shared machine") and fail
open; the SessionStart hook's `systemMessage` is what each client shows its user (docs/agents.md,
"A home it cannot trust is said where the user looks"). Here each client runs as in the other
tests of this folder, with its home made group- and world-writable after the hub started (so the
hub answers, and is never asked).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from switchboard_agent.hooks import UNSAFE_HOME_CONTEXT, UNSAFE_HOME_NOTICE
from tests.clients.harness import Terminal, client_bin, hub_in, hub_sessions, netns, strings

pytestmark = [pytest.mark.e2e, pytest.mark.clients]


def open_to_others(home: Path) -> str:
    """Make the agents' home (`clean_env(home)`'s) writable by everyone; the fix the user is given."""
    folder = home / ".switchboard"
    folder.chmod(0o777)
    return f"chmod 0700 {folder}"


def test_gemini_shows_why_it_is_not_connected(tmp_path: Path) -> None:
    from tests.clients.test_gemini import Model, Run, gemini_env, project_with_hooks

    with netns() as space:
        hub_in(space, tmp_path)
        env = gemini_env(tmp_path)
        project = project_with_hooks(tmp_path, env)
        fix = open_to_others(tmp_path)
        model = Model(space, tmp_path)
        model.release.touch()
        model.release_final.touch()

        run = Run(space, env, project, tmp_path / "gemini.log")
        run.finish()  # exit 0: the agent went on
        shown = run.log.read_text()

    assert UNSAFE_HOME_NOTICE in shown and fix in shown, shown[-3000:]  # `gemini -p`: on its stderr
    assert any(UNSAFE_HOME_CONTEXT in text for text in strings(model.turns()[0]))
    assert hub_sessions(tmp_path) == []


def test_claude_code_shows_why_it_is_not_connected(tmp_path: Path) -> None:
    from tests.clients.test_claude import claude, read_turn_in

    with netns() as space:
        hub_in(space, tmp_path)
        project = read_turn_in(space, tmp_path)
        fix = open_to_others(tmp_path)
        run = claude(
            space, tmp_path, project, "Read notes.txt.", "--output-format", "stream-json", "--verbose"
        )
        out, err = run.communicate(timeout=90)

    assert run.returncode == 0, err[-2000:]
    [shown] = [json.loads(line) for line in out.splitlines() if UNSAFE_HOME_NOTICE in line]
    print(json.dumps(shown)[:1500])
    assert fix in json.dumps(shown)
    requests = [json.loads(line) for line in (tmp_path / "model-requests.jsonl").read_text().splitlines()]
    assert any(UNSAFE_HOME_CONTEXT in text for text in strings(requests[-1]))
    assert hub_sessions(tmp_path) == []


def test_codex_takes_the_notice_and_tells_its_model(tmp_path: Path) -> None:
    """Codex validates a SessionStart answer against its schema (no other keys) and shows its
    `systemMessage` in its TUI; `codex exec` prints only that the hook completed. Its model is
    told (the answer's context), so it can tell the user why the Switchboard tools fail."""
    from tests.clients.test_codex import CODEX_TIMEOUT, CodexSetup

    with netns() as space:
        hub_in(space, tmp_path)
        setup = CodexSetup(space, tmp_path)
        setup.install_hooks()
        setup.trust()
        open_to_others(tmp_path)
        setup.start_model()
        setup.release.touch()
        # Its human output (not --json), where it says how each hook ended.
        argv = [
            "env",
            "-C",
            str(setup.project),
            str(setup.codex),
            "exec",
            "--skip-git-repo-check",
            "Say hello.",
        ]
        codex = space.start("codex", argv, setup.env, tmp_path / "codex.log")
        code = codex.popen.wait(timeout=CODEX_TIMEOUT)
        log = codex.log()

    assert code == 0, log[-3000:]
    assert "hook: SessionStart Completed" in log, log[-3000:]  # the answer passed Codex's schema
    assert json.dumps(UNSAFE_HOME_CONTEXT)[1:-1] in json.dumps(setup.requests())
    assert hub_sessions(tmp_path) == []


def squashed(text: str) -> str:
    """`text` without spaces, line ends and box lines: what a TUI wraps still reads the same."""
    return re.sub(r"[\s│╭╮╰╯─┃━]+", "", text)


def shown(screen: str, fix: str) -> bool:
    """Whether the notice and its fix are on the screen."""
    return squashed(UNSAFE_HOME_NOTICE) in squashed(screen) and squashed(fix) in squashed(screen)


def test_an_interactive_gemini_shows_why_it_is_not_connected(tmp_path: Path) -> None:
    """Interactive Gemini CLI shows the SessionStart answer's `systemMessage` in its history, with
    the fix, before any prompt."""
    from tests.clients.test_gemini import Model, gemini_env, project_with_hooks

    with netns() as space:
        hub_in(space, tmp_path)
        env = gemini_env(tmp_path)
        project = project_with_hooks(tmp_path, env)
        fix = open_to_others(tmp_path)
        Model(space, tmp_path)
        gemini = Terminal(space, [client_bin("gemini")], env, project)
        try:
            gemini.until(lambda: shown(gemini.screen(), fix), "the notice on its screen", timeout=60)
        finally:
            gemini.close()
    assert hub_sessions(tmp_path) == []
