"""cdui's layers, one import direction: every module under cdui/ imports only from its own
layer and the layers below it, no two modules import each other (even only for types), and
no import hides in a function unless a one-line reason below says why it must.

Python enforces none of this (Go's compiler does it for buildkite's api <- core <- agent), so
this test walks the ast of every module: top-level imports, imports inside functions and
imports under `if TYPE_CHECKING:` all count, because a type-only import still ties the two
modules together for the reader and for the next change that needs the name at run time.
"""
from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "cdui"

# ---------------------------------------------------------------------------------------
# THE table: each layer (a package prefix; a module belongs to the longest prefix that
# names it) and the layers it may import from, itself included. Every layer may import the
# top-level `cdui` package, which holds only __version__ and imports nothing.
_CORE = "cdui.core"
_WIRE = "cdui.wire"
_GRAPH = "cdui.graph"
_NODES = "cdui.nodes"
_RUN = "cdui.run"
_AGENT = "cdui.agent"
_SCHED = "cdui.plane.sched"
_STORE = "cdui.plane.store"
_PLANE = "cdui.plane"
_CLI = "cdui.cli"
_MAIN = "cdui.__main__"
_TOP = "cdui"

LAYERS: dict[str, frozenset[str]] = {
    # the package itself: __version__, nothing imported
    _TOP: frozenset({_TOP}),
    # errors, clock, paths, config, layout: depend on nothing of ours
    _CORE: frozenset({_TOP, _CORE}),
    # message shapes and their encoding, shared by the control plane, agents and runs
    _WIRE: frozenset({_TOP, _CORE, _WIRE}),
    # graphs and nodes: custom nodes import cdui.nodes.base, which refers to graph.context
    _GRAPH: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES}),
    _NODES: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES}),
    # executing a graph on this machine: runner, run process, spare, outputs, catalog
    _RUN: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES, _RUN}),
    # the worker agent: runs graphs, never imports the control plane
    _AGENT: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES, _RUN, _AGENT}),
    # pure policy (queue, placement, admission, device sets): no store, no run, no I/O
    _SCHED: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES, _SCHED}),
    # every SQL statement; may use policy's value types, nothing above
    _STORE: frozenset({_TOP, _CORE, _WIRE, _SCHED, _STORE}),
    # the control plane (server, run service, workers, ssh, http routes, files): all but agent and cli
    _PLANE: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES, _RUN, _SCHED, _STORE, _PLANE}),
    # the command line and its client: everything
    _CLI: frozenset({_TOP, _CORE, _WIRE, _GRAPH, _NODES, _RUN, _AGENT, _SCHED, _STORE, _PLANE, _CLI}),
    _MAIN: frozenset({_TOP, _CLI}),
}

# What may be imported inside a function, anywhere, and why: an optional extra (a node whose extra
# is missing stays in the catalog, marked unavailable, so its module must load without it) or a
# heavy import that a process which never needs it must not pay for. A key names a package or
# module and everything under it. Everything else is imported at the top of the module.
DEFERRED_ANYWHERE: dict[str, str] = {
    "torch": "seconds and hundreds of MB to import: only a run's process (and the catalog helper) pays for it; "
             "the control plane, the agent and the CLI load and list every node without it",
    "cdui.nodes.builtin._torchlib": "imports torch at its top (see torch)",
    "packaging": "checks a plugin pack's [python_deps] version constraints; in every pip-made environment but not "
                 "a dependency of cdui's, so without it only the presence of each distribution is checked",
    "numpy": "optional extra (classical, plots, vision, hf, video)",
    "sklearn": "optional extra `classical` (scikit-learn)",
    "matplotlib": "optional extra `plots`",
    "PIL": "optional extra `vision` (Pillow)",
    "gymnasium": "optional extra `rl`",
    "tokenizers": "optional extra `tokenizers`",
    "tiktoken": "optional extra `tokenizers`",
    "tiktoken_ext": "optional extra `tokenizers` (tiktoken's encodings)",
    "datasets": "optional extra `hf`",
    "av": "optional extra `video` (PyAV)",
    "boto3": "optional extra `s3`",
    "botocore": "optional extra `s3` (it comes with boto3)",
    "optuna": "optional extra `studies`: the control plane starts, and sweeps work, without it",
}

# Deferred imports of one of cdui's own modules by the modules under a package, and why:
# (importing package or module, imported module) -> the reason it waits.
DEFERRED_IMPORTS: dict[tuple[str, str], str] = {
    (_CLI, "cdui.plane.server"): "start-up cost of every command: the whole control plane (routes, run service, "
                                 "store, SSH); only `cdui start` runs it",
    (_CLI, "cdui.agent.agent"): "start-up cost of every command: the agent (connection, spool, runs, files); only "
                                "the `cdui agent` commands load it",
}

MAX_TOP_LEVEL_ENTRIES = 10


# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    src: str  # importing module, e.g. cdui.run.runner
    target: str  # imported module (a cdui module, or the top-level name of another package)
    file: str  # path relative to the checkout
    line: int
    text: str  # the statement as written
    deferred: bool  # inside a function body
    type_only: bool  # under `if TYPE_CHECKING:`

    def where(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}`"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The cdui module that `name` loads: itself if it is one, else the nearest package or
    module above it (`from cdui.x import y` where y is a function names module cdui.x)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    source = path.read_text()
    tree = ast.parse(source, str(path))
    rel = str(path.relative_to(ROOT))
    is_pkg = path.name == "__init__.py"
    found: list[Import] = []

    def add(node: ast.Import | ast.ImportFrom, target: str, deferred: bool, type_only: bool) -> None:
        found.append(Import(module, target, rel, node.lineno, ast.unparse(node), deferred, type_only))

    def visit(node: ast.AST, deferred: bool, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                add(node, _resolve(name, modules) if name.split(".")[0] == "cdui" else name.split(".")[0],
                    deferred, type_only)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "cdui":
                if name != "__future__":
                    add(node, name.split(".")[0], deferred, type_only)
                return
            for alias in node.names:
                add(node, _resolve(f"{name}.{alias.name}", modules), deferred, type_only)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            deferred = True
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, deferred, True)
            for child in node.orelse:
                visit(child, deferred, type_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, deferred, type_only)

    visit(tree, False, False)
    return list(dict.fromkeys(found))  # `from m import a, b` names module m once


def layer_of(module: str) -> str:
    best = ""
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    assert best, f"{module} is in no layer of LAYERS"
    return best


@functools.cache
def all_imports() -> list[Import]:
    modules = _modules()
    return [imp for mod, path in modules.items() for imp in _imports(mod, path, modules)]


def _is_cdui(target: str) -> bool:
    return target == "cdui" or target.startswith("cdui.")


# ---------------------------------------------------------------------------------------
def upward_imports(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        if not _is_cdui(imp.target):
            continue
        src, dst = layer_of(imp.src), layer_of(imp.target)
        if dst not in LAYERS[src]:
            kind = "type-only " if imp.type_only else "deferred " if imp.deferred else ""
            allowed = ", ".join(sorted(LAYERS[src]))
            bad.append(f"{imp.where()}: {kind}import of {imp.target} (layer {dst}) from layer {src}, "
                       f"which may import only: {allowed}")
    return bad


def import_cycles(imports: list[Import]) -> list[str]:
    """Every strongly connected set of cdui modules (Tarjan), with one cycle spelled out
    through the import statements that make it. Importing cdui.a.b.c also runs cdui/a and
    cdui/a/b's __init__.py, so those edges count too."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if not _is_cdui(imp.target) or imp.target == imp.src:
            continue
        edges.setdefault(imp.src, {}).setdefault(imp.target, imp)
        parts = imp.target.split(".")
        for n in range(1, len(parts)):
            package = ".".join(parts[:n])
            if not (imp.src == package or imp.src.startswith(package + ".")):
                text = f"{imp.text}`, which runs `{package.replace('.', '/')}/__init__.py"
                edges[imp.src].setdefault(package, replace(imp, target=package, text=text))
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in nodes:
        if v not in index:
            strong(v)

    out = []
    for comp in components:
        members = set(comp)
        # a shortest cycle through the set's first module: breadth-first until an edge returns to it
        start, last = comp[0], ""
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and not last:
            nxt = []
            for v in frontier:
                if start in edges.get(v, {}):
                    last = v
                    break
                for w in sorted(edges.get(v, {})):
                    if w in members and w not in prev and w != start:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        chain = []
        while last != start:
            chain.append(last)
            last = prev[last]
        cycle = [start] + chain[::-1] + [start]
        steps = []
        for a, b in zip(cycle, cycle[1:], strict=False):
            imp = edges[a][b]
            kind = " (type-only)" if imp.type_only else " (deferred)" if imp.deferred else ""
            steps.append(f"    {imp.where()}{kind}")
        out.append(f"import cycle among {len(comp)} modules ({', '.join(comp)}); one cycle:\n" + "\n".join(steps))
    return out


def _under(name: str, key: str) -> bool:
    return name == key or name.startswith(key + ".")


def _reason(imp: Import) -> str | None:
    for key, why in DEFERRED_ANYWHERE.items():
        if _under(imp.target, key):
            return why
    for (src, target), why in DEFERRED_IMPORTS.items():
        if _under(imp.src, src) and _under(imp.target, target):
            return why
    return None


def unlisted_deferred_imports(imports: list[Import]) -> list[str]:
    return [f"{imp.where()}: import of {imp.target} inside a function; make it a top-level import, or say why it "
            f"must wait in DEFERRED_ANYWHERE or DEFERRED_IMPORTS (tests/test_layers.py)"
            for imp in imports if imp.deferred and _reason(imp) is None]


def stale_allowlist(imports: list[Import]) -> list[str]:
    deferred = [i for i in imports if i.deferred]
    return ([f"DEFERRED_ANYWHERE lists {key!r}, but nothing imports it inside a function"
             for key in DEFERRED_ANYWHERE if not any(_under(i.target, key) for i in deferred)]
            + [f"DEFERRED_IMPORTS lists {key}, but no such deferred import remains" for key in DEFERRED_IMPORTS
               if not any(_under(i.src, key[0]) and _under(i.target, key[1]) for i in deferred)])


def _fail(problems: list[str], what: str) -> None:
    assert not problems, f"{len(problems)} {what}:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------
def test_no_upward_import():
    _fail(upward_imports(all_imports()), "imports against the layer table in tests/test_layers.py")


def test_no_import_cycle_counting_type_only_and_deferred_imports():
    _fail(import_cycles(all_imports()), "import cycles")


def test_no_deferred_import_without_a_reason():
    _fail(unlisted_deferred_imports(all_imports()), "deferred imports without a listed reason")


def test_allowlists_hold_no_stale_entry():
    _fail(stale_allowlist(all_imports()), "stale allowlist entries")


def test_at_most_ten_top_level_entries_in_cdui():
    entries = sorted(p.name for p in PKG.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL_ENTRIES, (
        f"cdui/ has {len(entries)} top-level entries ({', '.join(entries)}); at most {MAX_TOP_LEVEL_ENTRIES}: "
        "put a new module into the layer package it belongs to")


def test_every_module_is_in_a_layer():
    for module in _modules():
        layer_of(module)
