"""docs/architecture.md's module map stays true (no server needed).

The map is the section "## The modules and what each owns": one table per package,
whose first column names modules by their path (`cdui/plane/runs.py`), several in
one cell where they share a row. These tests fail when a module of ``cdui/`` is not
named there, or when the map names a file or folder that does not exist. When a
module is added, moved or split, add or change its row in that package's table.

Not named one by one: ``__main__.py``; an ``__init__.py`` that only marks a package
(one that defines a function or class is a module of its own and needs its row);
and the modules under a folder of GROUPS, which the map names as one row.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
MAP_HEADING = "## The modules and what each owns"
# The node library is one module per node family, described together (docs/nodes.md lists the nodes).
GROUPS = ("cdui/nodes/builtin/",)


def module_map() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert MAP_HEADING in text, f"docs/architecture.md has no section {MAP_HEADING!r}"
    section = text.split(MAP_HEADING, 1)[1]
    return section.split("\n## ", 1)[0]


def named() -> set[str]:
    """Every path in the first column of the map's tables."""
    names: set[str] = set()
    for line in module_map().splitlines():
        if line.startswith("| `"):
            first_cell = line[1:].split(" | ", 1)[0]
            names.update(re.findall(r"`([^`]+)`", first_cell))
    return names


def defines_code(init: Path) -> bool:
    tree = ast.parse(init.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def modules() -> set[str]:
    """Every module of cdui/ that the map must name."""
    found: set[str] = set()
    for path in (ROOT / "cdui").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__main__.py" or rel.startswith(GROUPS):
            continue
        if path.name == "__init__.py" and not defines_code(path):
            continue
        found.add(rel)
    return found


def test_the_map_names_every_module() -> None:
    missing = sorted(modules() - named())
    assert missing == [], (f"docs/architecture.md's module map does not name {missing}: add a row for each "
                           f"under its package's table ({MAP_HEADING!r}), saying what the module owns")


def test_the_map_names_only_what_exists() -> None:
    gone = sorted(name for name in named() if not (ROOT / name).exists())
    assert gone == [], (f"docs/architecture.md's module map names {gone}, which do not exist: "
                        f"update or remove those rows")


def test_each_group_is_named_as_one_row() -> None:
    assert set(GROUPS) <= named(), f"the module map should name the folders {GROUPS} as one row each"


def test_the_map_finds_modules_and_names() -> None:
    """The two sets the tests compare are really read (a parse that found nothing would pass vacuously)."""
    assert "cdui/plane/runs.py" in modules() and "cdui/plane/runs.py" in named()
    assert "cdui/core/errors.py" in named()
    assert len(named()) > 50
