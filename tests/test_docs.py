"""README.md and docs/ against the code: every relative link leads to a file that exists, and every
`switchboard ...` command they show names a real subcommand with options that subcommand takes
(`switchboard manage X`: a management command the hub has)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GLOBAL_WITH_VALUE = {"--url", "--session"}


def _code(text: str) -> list[str]:
    """The lines of fenced blocks and the inline code spans of a Markdown page."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines()] + re.findall(r"`([^`\n]+)`", prose)


def commands_shown(text: str, *, bare_in_tables: bool = False) -> list[list[str]]:
    """Each `switchboard ...` invocation in the page's code, as its words up to the end of the command;
    with `bare_in_tables`, also the code in each table's first column, which names commands without
    the program (docs/cli.md; under a heading about `manage`, management commands)."""
    found = []
    prefix: list[str] = []
    for line in text.splitlines() if bare_in_tables else []:
        if line.startswith("#"):
            prefix = ["manage"] if "manage" in line else []
        elif line.startswith("| `"):
            found.extend(
                prefix + span.split() for span in re.findall(r"`([^`]+)`", re.split(r"(?<!\\)\|", line)[1])
            )
    for code in _code(text):
        for match in re.finditer(r"(?:^|[\s/(\"'$])switchboard((?:\s+[^\s|;&)#`\"']+)+)", code):
            words = match.group(1).split()
            if words:
                found.append(words)
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def problems_with(words: list[str], parser: argparse.ArgumentParser, django_commands: set[str]) -> list[str]:
    """What is wrong with one shown command: an unknown subcommand, or an option it does not take."""
    rest = list(words)
    while rest and rest[0].startswith("--"):  # global options before the subcommand
        rest = rest[2:] if rest[0] in GLOBAL_WITH_VALUE else rest[1:]
    if not rest or not re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        return []  # a path or a placeholder after the word, not a command
    commands = _subparsers(parser)
    name, rest = rest[0], rest[1:]
    if name not in commands:
        return [f"no subcommand {name!r}"]
    if name == "web":
        return []  # daphne parses its own options
    if name == "manage":
        known = django_commands | {"help"}
        shown = rest[0] if rest and re.fullmatch(r"[a-z_]+", rest[0]) else None  # not a placeholder
        return [f"no management command {shown!r}"] if shown and shown not in known else []
    sub = commands[name]
    nested = _subparsers(sub)
    if nested and rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        if rest[0] not in nested:
            return [f"no subcommand {name} {rest[0]!r}"]
        sub, rest = nested[rest[0]], rest[1:]
    allowed = _options(sub) | _options(parser)
    words_bare = [w.lstrip("[(") for w in rest]
    flags = {re.sub(r"[\])\[,.:]+$", "", w).split("=")[0] for w in words_bare if w.startswith("--")}
    return [f"{name}: no option {flag}" for flag in sorted(flags) if flag not in allowed]


def test_every_switchboard_command_in_the_docs_exists():
    from django.core.management import get_commands

    from switchboard_agent.cli import build_parser

    parser = build_parser()
    django_commands = set(get_commands())
    wrong = {}
    for page in PAGES:
        for words in commands_shown(page.read_text(encoding="utf-8"), bare_in_tables=page.name == "cli.md"):
            found = problems_with(words, parser, django_commands)
            if found:
                wrong.setdefault(page.name, []).append((" ".join(words), found))
    assert not wrong, wrong


def test_the_command_check_catches_what_it_should():
    from switchboard_agent.cli import build_parser

    parser = build_parser()
    shown = commands_shown(
        "`switchboard --session alice send bob hi --urgent`, `switchboard sned x`, "
        "`switchboard inbox --wiat 3`, `switchboard tasks claimm`, `switchboard status [--fnal T]`\n"
        "```sh\nswitchboard manage operator_create ada --no-admin   # ok\nswitchboard manage operator_creat x\n```\n"
    )
    verdicts = [problems_with(words, parser, {"operator_create"}) for words in shown]
    assert verdicts == [
        [],  # manage operator_create ada --no-admin
        ["no management command 'operator_creat'"],
        [],  # --session alice send bob hi --urgent
        ["no subcommand 'sned'"],
        ["inbox: no option --wiat"],
        ["no subcommand tasks 'claimm'"],
        ["status: no option --fnal"],
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page: Path):
    text = page.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    missing = []
    for link in links:
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        target = (page.parent / link.split("#", 1)[0]).resolve()
        if not target.exists():
            missing.append(link)
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_repository_paths_named_exist(page: Path):
    """A path in code quotes whose first folder is one of the repository's (`messaging/policy.py`,
    `bench/purge.py`) names a file or folder that exists: files move, and pages must follow."""
    named = re.findall(r"`([a-z_]+(?:/[A-Za-z0-9_.-]+)+)`", page.read_text(encoding="utf-8"))
    stale = [p for p in named if (REPO / p.split("/")[0]).exists() and not (REPO / p).exists()]
    assert not stale, f"{page.relative_to(REPO)} names paths that do not exist: {stale}"
