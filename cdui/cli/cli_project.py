"""``cdui project``: make a project folder (``init``) and check every graph in it (``validate``).

``validate`` is meant as a lab's CI gate for its graph repository: it needs no server, builds the
same registry a server opened on the project would (built-in nodes, the installation's plugin packs,
the project's ``custom_nodes/``), the same preset library (built-in presets and the project's
``presets/``), and checks each ``graphs/<name>.graph.json`` as a submit would (cdui/graph/validate.py):
entry points, wiring, port types, node types and params, presets. It also refuses a secret written into
a graph (a ``secret``-typed param with a value: it would be committed) and a ``.env`` git tracks.
Every problem is printed on its own line naming the graph and the node; the exit code is 1 when any
was found.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cdui.cli.cli_util import _die
from cdui.core import config, project
from cdui.core.errors import CduiError
from cdui.core.layout import Layout
from cdui.graph.presets import preset_library
from cdui.graph.secrets import describe_path, split_secrets
from cdui.graph.validate import validate_graph
from cdui.nodes.registry import build_registry


def cmd_init(args: argparse.Namespace) -> int:
    try:
        folder, created = project.scaffold(args.dir)
    except CduiError as err:
        return _die(str(err), 2)
    said = project.git_init(folder)
    if created:
        print(f"project {folder}: created {', '.join(created)}; {said}")
    else:
        print(f"project {folder} already has every part of a project; nothing was written; {said}")
    print(f"next: add graphs under {folder / 'graphs'}, then `cdui project validate {args.dir}` and "
          f"`cdui start --project {args.dir}`")
    return 0


def _node_label(graph: Any, node_id: Any) -> str:
    if not node_id:
        return ""
    for n in graph.get("nodes") or [] if isinstance(graph, dict) else []:
        if isinstance(n, dict) and n.get("id") == node_id:
            return f"node {node_id} ({n.get('type')}): "
    return f"node {node_id}: "


def check_graph(graph: Any, registry: Any, library: dict[str, Any], max_nodes: int,
                layout: Layout | None) -> list[str]:
    """Every problem of one graph, each a line naming the node where there is one."""
    problems: list[str] = []
    if not isinstance(graph, dict):
        return ["the file is not a JSON object"]
    _stored, found = split_secrets(graph, registry, library)
    for path, _value in found:
        if path:
            problems.append(f"a secret value is written in the graph at {describe_path(graph, path)}: it would be "
                            "committed (leave the param empty; give the value at run time or from .env)")
    try:
        _plan, errors = validate_graph(graph, registry, library, max_nodes, layout)
    except CduiError as exc:  # graph_too_large: refused before it is expanded
        return [*problems, f"{exc.message}" + (f" ({exc.hint})" if exc.hint else "")]
    for e in errors:
        line = _node_label(graph, e.get("node_id")) + str(e.get("message"))
        if e.get("hint"):
            line += f" ({e['hint']})"
        problems.append(line)
    settings = graph.get("settings")
    if settings is not None:
        device = settings.get("device") if isinstance(settings, dict) else None
        if not isinstance(settings, dict) or (device is not None and not _device_ok(device)):
            problems.append(f"settings.device {device!r} is not cpu, cuda, cuda:N or mps (fix the graph's settings)")
    return problems


def _device_ok(device: Any) -> bool:
    if not isinstance(device, str):
        return False
    if device in ("cpu", "cuda", "mps", "auto"):
        return True
    kind, _, n = device.partition(":")
    return kind == "cuda" and n.isdigit()


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        folder = project.find(args.dir)
        project.manifest(folder)
    except CduiError as err:
        return _die(str(err), 2)
    cfg = config.load()
    names = project.graph_names(folder)
    wanted = list(dict.fromkeys(args.graph or []))
    unknown = [n for n in wanted if n not in names]
    if unknown:
        return _die(f"no graph {', '.join(map(repr, unknown))} in {folder / 'graphs'} (its graphs: "
                    f"{', '.join(names) or 'none'}); a --graph NAME is the file name without {project.GRAPH_SUFFIX}",
                    1)
    problems: list[str] = []
    if project.tracked(folder, ".env"):
        problems.append(f"{folder / '.env'} is tracked by git: its secrets are in the repository "
                        "(run `git rm --cached .env`, keep it in .gitignore, and change the secrets it held)")
    # The installed packs too (cdui plugin install): a graph that uses their nodes or presets is valid here
    # exactly when a server opened on the project would run it.
    registry = build_registry(folder / "custom_nodes", cfg.plugins_dir, cfg.plugin_store)
    library = preset_library(folder / "presets", cfg.plugin_store)
    max_nodes = cfg["CODEFYUI_GRAPH_MAX_NODES"]
    # --strict also checks what each graph reads on this machine (its files under assets/ exist).
    layout = Layout.from_env({**_env(), project.PROJECT_SETTING: str(folder)}) if args.strict else None
    checked = 0
    failed = 0
    for name in wanted or names:
        checked += 1
        try:
            graph = project.load_graph(folder, name, cfg["CODEFYUI_MAX_GRAPH_BYTES"])
            found = check_graph(graph, registry, library, max_nodes, layout)
        except CduiError as err:
            found = [str(err)]
        if found:
            failed += 1
        problems.extend(f"graph {name}: {p}" for p in found)
    for stray in sorted((folder / "graphs").glob("*.json")) if (folder / "graphs").is_dir() else []:
        if not stray.name.endswith(project.GRAPH_SUFFIX):
            line = (f"{stray} is not read as a graph: project graphs are named <name>{project.GRAPH_SUFFIX} "
                    f"(rename it to {stray.stem}{project.GRAPH_SUFFIX})")
            if args.strict:
                problems.append(line)
            else:
                print(f"cdui: warning: {line}", file=sys.stderr)
    counted = f"{checked} graph{'s' if checked != 1 else ''} checked"
    if problems:
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        print(f"Validation failed: {len(problems)} problem(s), {failed} of {counted}", file=sys.stderr)
        return 1
    print(f"Validation passed ({counted})")
    return 0


def _env() -> dict[str, str]:
    return dict(os.environ)


def add_parsers(sub: Any) -> Any:
    """The ``cdui project`` group with ``init`` and ``validate``; returns the group's action parsers'
    holder so other project commands (freeze, restore) can be added to it."""
    p = sub.add_parser("project", help="project folders: CodefyUI's layout of a lab's graph repository")
    psub = p.add_subparsers(dest="project_command", metavar="ACTION", required=True, parser_class=type(p))
    s = psub.add_parser("init", help="make DIR a project: codefyui.project.toml, graphs/, layout/, assets/, "
                                     ".env.example")
    s.add_argument("dir", metavar="DIR", help="a new or empty folder (or a project, to add what it lacks)")
    s.set_defaults(func=cmd_init)
    s = psub.add_parser("validate", help="check every graph of the project DIR (the CI gate); exit 1 on any problem")
    s.add_argument("dir", metavar="DIR", help="the project folder (holds codefyui.project.toml)")
    s.add_argument("--graph", action="append", default=None, metavar="NAME",
                   help="check only this graph (graphs/NAME.graph.json); repeatable")
    s.add_argument("--strict", action="store_true",
                   help="also fail on graph files not named NAME.graph.json and on files a graph reads that "
                        "are missing here")
    s.set_defaults(func=cmd_validate)
    return psub

