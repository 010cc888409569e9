"""Layers point down (docs/architecture.md): a package imports only itself and the floors below it,
so no import loop can cross packages, and no module imports another module's private (`_x`) name.

Read from the source with `ast`, every import counts: at the top of a module, inside a function,
or under `if TYPE_CHECKING:`; and so does a string that names another package's module (a task
name such as "federation.tasks.forward_delivery", a dotted path such as "hub.logs.JsonLines") or a
URL in another package's namespace ("console:message", as `reverse` takes it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each package's floor. A package may import packages on lower floors; on its own floor, only itself
# (teams and federation build on messaging side by side and know nothing of each other).
FLOORS: dict[str, int] = {
    "switchboard_agent": 0,  # the agent client: no Django, none of the hub's packages
    "messaging": 1,  # the ground floor of the hub: sessions, messages, deliveries
    "teams": 2,
    "federation": 2,
    "alerts": 3,  # operator alerts: built on messaging and teams
    "console": 4,  # the operator's UI
    "hub": 5,  # the Django project: settings, ASGI, Celery app, server, database backend
}

# Outside the product, above it: the harness the tests and the benchmarks share, then the tests and
# the benchmarks side by side, so neither imports the other and nothing below imports either.
BESIDE: dict[str, int] = {
    "hub_topology": 6,  # hubs started as processes
    "hub_fixtures": 6,  # data and loads put into a hub in-process (corpora, history, races)
    "tests": 7,
    "bench": 7,
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    line: int
    target: str  # the imported module, dotted
    names: tuple[str, ...]  # the names taken from it (`from target import names`)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(root: Path, packages: dict[str, int]) -> Iterator[Import]:
    """Every import statement in the packages' source under `root`, and every string that names a
    module of one of the packages, or something in one (migrations excluded: Django writes them)."""
    dotted = re.compile(rf"^(?:{'|'.join(map(re.escape, packages))})(?:\.\w+)+(?::\w+)?$")
    # "console:message": a URL name in a package's namespace (`reverse`) names that package too.
    url_name = re.compile(rf"^({'|'.join(map(re.escape, packages))}):[\w-]+$")
    sources = {
        _module_name(path, root): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if "migrations" not in path.parts and "node_modules" not in path.parts  # npm's, not ours
    }

    def names_a_module(value: str) -> bool:  # "hub.event" (an event's type) names none
        parts = value.split(":")[0].split(".")
        return any(".".join(parts[:n]) in sources for n in range(2, len(parts) + 1))

    for module, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, node.lineno, alias.name, ())
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against the importing module's package
                    base = module.split(".")
                    base = base[: len(base) - node.level + (path.name == "__init__.py")]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                yield Import(module, node.lineno, target, tuple(a.name for a in node.names))
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and ((dotted.match(node.value) and names_a_module(node.value)) or url_name.match(node.value))
            ):
                yield Import(module, node.lineno, node.value.split(":")[0], ())


def upward_imports(root: Path, packages: dict[str, int]) -> list[str]:
    """Imports of a package on the same or a higher floor than the importer's (itself excepted)."""
    found = []
    for imp in imports_in(root, packages):
        mine, theirs = imp.module.split(".")[0], imp.target.split(".")[0]
        if theirs in packages and theirs != mine and packages[theirs] >= packages[mine]:
            found.append(f"{imp.module}:{imp.line} imports {imp.target}")
    return found


def package_cycles(root: Path, packages: dict[str, int]) -> list[list[str]]:
    """Loops in the graph of which package imports which (each loop once, as a path)."""
    edges: dict[str, set[str]] = {p: set() for p in packages}
    for imp in imports_in(root, packages):
        mine, theirs = imp.module.split(".")[0], imp.target.split(".")[0]
        if theirs in packages and theirs != mine:
            edges[mine].add(theirs)
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(edges[path[-1]]):
            if nxt == path[0] and frozenset(path) not in seen:
                seen.add(frozenset(path))
                cycles.append([*path, nxt])
            elif nxt not in path:
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    return cycles


def private_names_crossing(root: Path, packages: dict[str, int]) -> list[str]:
    """`from other.module import _name`: a private name used outside the module that defines it."""
    return [
        f"{imp.module}:{imp.line} takes {name} from {imp.target}"
        for imp in imports_in(root, packages)
        for name in imp.names
        if name.startswith("_") and not name.startswith("__") and imp.target != imp.module
    ]


def test_no_package_imports_one_on_its_floor_or_above() -> None:
    assert upward_imports(ROOT, FLOORS) == []


def test_no_import_loop_crosses_packages() -> None:
    assert package_cycles(ROOT, FLOORS) == []


def test_no_private_name_is_imported_from_another_module() -> None:
    assert private_names_crossing(ROOT, FLOORS) == []


def test_the_benchmarks_import_nothing_from_the_tests() -> None:
    """What a benchmark shares with the tests (a hub process, a corpus, a race) is in hub_topology or
    hub_fixtures: bench/ imports nothing from tests/, tests/ nothing from bench/, and the product
    neither, nor the harness."""
    assert upward_imports(ROOT, FLOORS | BESIDE) == []


def test_the_checks_read_every_package() -> None:
    """The checks above read real source: each package FLOORS names is a folder of the repository."""
    assert [p for p in FLOORS if not (ROOT / p / "__init__.py").is_file()] == []
    assert any(i.target.startswith("messaging") for i in imports_in(ROOT, {"teams": 2}))
    assert [p for p in BESIDE if not (ROOT / p).is_dir()] == []
    assert any(i.target.startswith("hub_topology") for i in imports_in(ROOT, {"bench": 7}))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small source tree: `low` is below `high`; `left` and `right` share a floor."""
    for package in ("low", "high", "left", "right"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    return tmp_path


FAKE = {"low": 0, "left": 1, "right": 1, "high": 2}


def test_an_import_from_a_higher_floor_inside_a_function_is_found(tree: Path) -> None:
    (tree / "low" / "core.py").write_text("def f():\n    from high.views import page\n    return page\n")
    (tree / "high" / "views.py").write_text("from low.core import f\n")
    assert upward_imports(tree, FAKE) == ["low.core:2 imports high.views"]
    assert package_cycles(tree, FAKE) == [["high", "low", "high"]]


def test_a_string_naming_a_higher_module_counts(tree: Path) -> None:
    (tree / "high" / "tasks.py").write_text("def forward(n):\n    return n\n")
    (tree / "low" / "jobs.py").write_text('enqueue("high.tasks.forward", 1)\nKIND = "high.event"\n')
    assert upward_imports(tree, FAKE) == ["low.jobs:1 imports high.tasks.forward"]


def test_a_url_name_in_a_higher_packages_namespace_counts(tree: Path) -> None:
    (tree / "low" / "admin.py").write_text('reverse("high:message", args=[1])\nACTOR = "operator:root"\n')
    assert upward_imports(tree, FAKE) == ["low.admin:1 imports high"]


def test_packages_on_one_floor_may_not_import_each_other(tree: Path) -> None:
    (tree / "left" / "a.py").write_text("import right.b\n")
    assert upward_imports(tree, FAKE) == ["left.a:1 imports right.b"]


def test_a_private_name_taken_from_another_module_is_found(tree: Path) -> None:
    (tree / "low" / "refs.py").write_text("def _new_ref():\n    return 'x'\n")
    (tree / "high" / "use.py").write_text("from low.refs import _new_ref\nfrom . import __doc__\n")
    assert private_names_crossing(tree, FAKE) == ["high.use:1 takes _new_ref from low.refs"]


def test_downward_imports_pass(tree: Path) -> None:
    (tree / "high" / "ok.py").write_text("import low\nfrom left import x\nfrom .ok import y\n")
    assert upward_imports(tree, FAKE) == [] and package_cycles(tree, FAKE) == []
