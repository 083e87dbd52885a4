"""Every SQL statement of cdui lives in the store package (cdui/plane/store/),
behind typed methods, and none is assembled from keyword names.

A walk over the ast of every module: a string constant (or the literal parts of
an f-string) shaped like an SQL statement outside the store fails the first
test; inside the store, an f-string that builds SQL may interpolate only
placeholder lists (``?,?,?``), never a column name taken from a caller.
Docstrings are prose and are left out.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cdui"
STORE = ROOT / "plane" / "store"

# Upper case only, and each keyword where a statement has it: prose ("select a file from"),
# HTTP methods ("DELETE /api/...") and PEM markers ("-----BEGIN CERTIFICATE") do not match.
SQL = re.compile(r"""
    \bSELECT\s+(DISTINCT\s+)?[\w*(),.'$\s{}]+?\s+FROM\s+\w
  | \bINSERT\s+(OR\s+[A-Z]+\s+)?INTO\s+\w
  | \bREPLACE\s+INTO\s+\w
  | \bUPDATE\s+\w+\s+SET\s
  | \bDELETE\s+FROM\s+\w
  | \b(CREATE|DROP)\s+(UNIQUE\s+)?(TABLE|INDEX|VIEW|TRIGGER)\b
  | \bALTER\s+TABLE\b
  | \bPRAGMA\s+\w+
  | (?<!-)\bBEGIN(\s+(IMMEDIATE|EXCLUSIVE|DEFERRED))?\s*(TRANSACTION)?\s*$
  | ^\s*(COMMIT|ROLLBACK|SAVEPOINT\s+\w+|RELEASE\s+\w+)\s*$
""", re.VERBOSE)


def modules(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def sql_strings(path: Path) -> Iterator[tuple[int, str, ast.AST]]:
    """(line, text, node) of every string constant or f-string in ``path`` that reads as SQL."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docs = _docstrings(tree)
    inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                           for v in node.values)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and id(node) not in inside_fstrings):
            text = node.value
        else:
            continue
        if SQL.search(text):
            yield node.lineno, text, node


def test_the_pattern_tells_sql_from_prose() -> None:
    sql = ["SELECT * FROM workers WHERE name=?", "SELECT 1 FROM workers", "INSERT OR REPLACE INTO old_credentials",
           "UPDATE workers SET drained=? WHERE name=?", "DELETE FROM ssh_cleanups WHERE slot=?", "BEGIN IMMEDIATE",
           "PRAGMA user_version", "CREATE TABLE x (a)", "ALTER TABLE workers ADD COLUMN y", "COMMIT",
           "SELECT name, share_by_memory FROM workers", "SELECT slot FROM ssh_workers UNION SELECT slot FROM x"]
    prose = ["DELETE", "DELETE /api/workers/{name}", "-----BEGIN CERTIFICATE-----", "select a file from the list",
             "Updates the worker", "UPDATE", "the run's BEGIN marker", "delete from the list"]
    assert [s for s in sql if not SQL.search(s)] == []
    assert [s for s in prose if SQL.search(s)] == []


def test_no_sql_outside_the_store() -> None:
    found = [f"{p.relative_to(ROOT.parent)}:{line}: {text.strip()[:90]!r}"
             for p in modules(ROOT) if STORE not in p.parents
             for line, text, _ in sql_strings(p)]
    assert found == [], ("SQL outside cdui/plane/store/ (give the store a typed method and call that):\n"
                         + "\n".join(found))


# What an f-string in the store may put into SQL: placeholder lists, and the migration's own number.
PLACEHOLDERS = re.compile(r"""^['"],['"]\.join\(['"]\?['"] \* len\(\w+\)\)$""")
ALLOWED_VALUES = {"i + 1"}


def test_store_sql_is_never_assembled_from_names() -> None:
    assert (STORE / "__init__.py").exists()
    bad = []
    for p in modules(STORE):
        for line, text, node in sql_strings(p):
            if not isinstance(node, ast.JoinedStr):
                continue
            for v in node.values:
                if isinstance(v, ast.FormattedValue):
                    src = ast.unparse(v.value)
                    if not PLACEHOLDERS.match(src) and src not in ALLOWED_VALUES:
                        bad.append(f"{p.relative_to(ROOT.parent)}:{line}: {{{src}}} in {text.strip()[:80]!r}")
    assert bad == [], ("SQL built from names in the store (write the statement out for each use):\n"
                       + "\n".join(bad))
