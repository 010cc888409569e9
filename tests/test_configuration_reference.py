"""docs/configuration.md lists every SWITCHBOARD_* environment variable the code reads, and only those.

The code is every project file outside tests/ and docs/: each package (found by walking the tree, so
a new one is scanned without a change here), bench/, manage.py, scripts/, compose.yaml, Dockerfile.
A variable is read where Python names it as a whole string literal (`os.environ.get("SWITCHBOARD_X")`,
`_env_int("SWITCHBOARD_X", 5)`, `"SWITCHBOARD_X" in os.environ`), or where a shell script, compose
file or Dockerfile names it at all. A settings attribute that shares the name (`settings.SWITCHBOARD_X`,
`getattr(settings, "SWITCHBOARD_X")`) is not a read."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "configuration.md"
NAME = r"SWITCHBOARD_[A-Z0-9_]+"
SKIPPED_DIRS = {"tests", "docs", "node_modules", "__pycache__"}
SHELL_LIKE = {"Dockerfile", "compose.yaml", "compose.yml"}


def _code_files() -> list[Path]:
    files = []
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        if parts[:2] == ("bench", "results") or not path.is_file():
            continue
        if path.suffix == ".py" or path.name in SHELL_LIKE or parts[0] == "scripts" or path.suffix == ".sh":
            files.append(path)
    return files


def variables_read(files: list[Path], root: Path = REPO) -> dict[str, set[str]]:
    """Each variable the code reads, with the files that read it."""
    found: dict[str, set[str]] = {}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".py":
            text = re.sub(rf"getattr\(\s*settings\s*,\s*[\"']{NAME}[\"']", "", text)
            names = re.findall(rf"[\"']({NAME})[\"']", text)
        else:
            names = re.findall(rf"\b({NAME})\b", text)
        for name in names:
            found.setdefault(name, set()).add(str(path.relative_to(root)))
    return found


def variables_listed(reference: str) -> set[str]:
    """The variables the reference's tables list: the names in each row's first cell."""
    listed = set()
    for line in reference.splitlines():
        if line.startswith("|"):
            first_cell = line.split("|")[1]
            listed.update(re.findall(rf"`({NAME})`", first_cell))
    return listed


def test_the_scan_finds_reads_of_each_kind(tmp_path):
    """The scanner itself: a Python read, a settings attribute that is not one, a shell read."""
    (tmp_path / "a.py").write_text(
        'import os\nX = os.environ.get("SWITCHBOARD_ONE")\nY = _env_int("SWITCHBOARD_TWO", 1)\n'
        'Z = settings.SWITCHBOARD_THREE\nW = getattr(settings, "SWITCHBOARD_FOUR", 0)\n'
    )
    (tmp_path / "serve").write_text('echo "${SWITCHBOARD_FIVE:-x}"\n')
    found = variables_read([tmp_path / "a.py", tmp_path / "serve"], tmp_path)
    assert set(found) == {"SWITCHBOARD_ONE", "SWITCHBOARD_TWO", "SWITCHBOARD_FIVE"}
    assert variables_listed(
        "| `SWITCHBOARD_A` / `SWITCHBOARD_B` | 1 | `SWITCHBOARD_C` is not listed |\n"
    ) == {
        "SWITCHBOARD_A",
        "SWITCHBOARD_B",
    }


def test_every_variable_the_code_reads_is_in_the_reference():
    read = variables_read(_code_files())
    # The scan reaches the hub's settings and the agent client.
    assert {"SWITCHBOARD_HOME", "SWITCHBOARD_ENROLL_KEY", "SWITCHBOARD_URL"} <= set(read)
    listed = variables_listed(REFERENCE.read_text(encoding="utf-8"))
    missing = {name: sorted(where) for name, where in read.items() if name not in listed}
    assert not missing, f"read by the code but not in docs/configuration.md: {missing}"
    stale = listed - set(read)
    assert not stale, f"in docs/configuration.md but read nowhere in the code: {sorted(stale)}"
