"""Parsing CodefyUI graph JSON and expanding presets.

A graph is ``{"format_version": 1, "nodes": [...], "edges": [...], "presets": [...]}``.
Nodes of type ``note`` (and other canvas-only annotations) are dropped.
``preset:<name>`` nodes are replaced by the preset's inner nodes, with ids
``<presetNodeId>__<innerId>`` and ``data.internalParams`` overriding inner
params; nesting is allowed up to :data:`MAX_PRESET_DEPTH` levels.

Size is bounded before anything is expanded: a few KiB of presets nested 8
wide and 9 deep would expand to 134 million nodes. :func:`expansion_size`
counts the nodes and edges an expansion would produce from the preset
definitions alone (memoised per preset, so counting is linear in the size of
the definitions), and :func:`parse` raises ``graph_too_large`` when the count
passes ``max_nodes`` (edges: five times that) or presets nest deeper than
:data:`MAX_PRESET_DEPTH` (a preset that contains itself never ends).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError

ANNOTATION_TYPES = {"note", "group", "comment", "frame"}
MAX_PRESET_DEPTH = 10
DEFAULT_MAX_NODES = 20000
EDGES_PER_NODE = 5
PRESET_PREFIX = "preset:"


@dataclass
class GNode:
    id: str
    type: str
    params: dict[str, Any]
    origin: str  # the id the user sees (outermost preset node for expanded nodes)


@dataclass
class GEdge:
    source: str
    target: str
    source_handle: str
    target_handle: str
    kind: str  # "data" | "trigger"


@dataclass
class Graph:
    nodes: dict[str, GNode] = field(default_factory=dict)
    edges: list[GEdge] = field(default_factory=list)
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)


def err(node_id: str | None, code: str, message: str, **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"node_id": node_id, "code": code, "message": message}
    e.update(extra)
    return e


def preset_index(raw_presets: Any, errors: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if raw_presets is None:
        return out
    if not isinstance(raw_presets, list):
        errors.append(err(None, "bad_presets", f"'presets' must be a list, got {type(raw_presets).__name__}"))
        return out
    for i, p in enumerate(raw_presets):
        name = p.get("preset_name") or p.get("name") if isinstance(p, dict) else None
        if not name or not isinstance(p.get("nodes"), list):
            errors.append(err(None, "bad_preset", f"presets[{i}] needs 'preset_name' and a 'nodes' list"))
            continue
        out[str(name)] = p
    return out


def _edge_kind(e: dict[str, Any]) -> str:
    if e.get("type") == "trigger" or e.get("sourceHandle") == "trigger" and e.get("type") != "data":
        return "trigger"
    return "data"


def _is_preset(n: Any) -> bool:
    return isinstance(n, dict) and isinstance(n.get("type"), str) and n["type"].startswith(PRESET_PREFIX)


def expansion_size(top_types: list[str], top_edges: int, presets: dict[str, dict[str, Any]],
                   stop_at: int) -> tuple[int, int, int, bool]:
    """(nodes, edges, nesting depth, partial) of the graph once every preset is expanded.

    Counted from the definitions without building anything. Counting stops
    early once ``stop_at`` nodes are passed; ``partial`` then says the counts
    are lower bounds.
    Raises ``graph_too_large`` when presets nest deeper than MAX_PRESET_DEPTH.
    """
    memo: dict[str, tuple[int, int, int]] = {}
    truncated: list[str] = []  # presets whose count stopped early

    def size(name: str, depth: int) -> tuple[int, int, int]:
        if name in memo:
            return memo[name]
        if depth > MAX_PRESET_DEPTH:
            raise _too_deep()
        preset = presets.get(name)
        if preset is None:
            return 0, 0, 0  # reported as unknown_preset by the expansion
        raw_nodes, raw_edges = preset.get("nodes"), preset.get("edges")
        inner = raw_nodes if isinstance(raw_nodes, list) else []
        edges = raw_edges if isinstance(raw_edges, list) else []
        n_nodes, n_edges, height = 0, len(edges), 0
        for n in inner:
            if not (isinstance(n, dict) and "id" in n and "type" in n):
                continue
            if _is_preset(n):
                a, b, h = size(n["type"][len(PRESET_PREFIX):], depth + 1)
                n_nodes, n_edges, height = n_nodes + a, n_edges + b, max(height, h)
            else:
                n_nodes += 1
            if n_nodes > stop_at:
                truncated.append(name)
                break
        memo[name] = (n_nodes, n_edges, height + 1)
        return memo[name]

    total_nodes, total_edges, depth = 0, top_edges, 0
    for t in top_types:
        if t.startswith(PRESET_PREFIX):
            a, b, h = size(t[len(PRESET_PREFIX):], 1)
            total_nodes, total_edges, depth = total_nodes + a, total_edges + b, max(depth, h)
        else:
            total_nodes += 1
    return total_nodes, total_edges, depth, bool(truncated)


def _too_deep() -> CduiError:
    return CduiError("graph_too_large", f"presets nest deeper than {MAX_PRESET_DEPTH} levels (or a preset "
                                        f"contains itself)",
                     hint=f"CodefyUI allows {MAX_PRESET_DEPTH} levels of presets inside presets; flatten the "
                          f"innermost ones")


def check_size(top_types: list[str], top_edges: int, presets: dict[str, dict[str, Any]], max_nodes: int) -> None:
    """Raise ``graph_too_large`` before expanding a graph that would pass ``max_nodes``."""
    nodes, edges, _, partial = expansion_size(top_types, top_edges, presets, max_nodes)
    hint = "CODEFYUI_GRAPH_MAX_NODES on the server sets the limit; or split the graph"
    if nodes > max_nodes:
        got = f"more than {max_nodes}" if partial else f"{nodes}"
        raise CduiError("graph_too_large", f"the graph would expand to {got} nodes once its presets are "
                                           f"expanded, over the limit of {max_nodes}", hint=hint)
    if edges > max_nodes * EDGES_PER_NODE:
        raise CduiError("graph_too_large", f"the graph would expand to {edges} edges once its presets are "
                                           f"expanded, over the limit of {max_nodes * EDGES_PER_NODE} "
                                           f"({EDGES_PER_NODE} per allowed node)", hint=hint)


def parse(raw: Any, library: dict[str, dict[str, Any]] | None = None,
          max_nodes: int | None = DEFAULT_MAX_NODES) -> tuple[Graph, list[dict[str, Any]]]:
    """Parse and expand a graph; return it with every structural error found.

    Raises ``graph_too_large`` (a :class:`CduiError`) before expanding past
    ``max_nodes`` nodes or :data:`MAX_PRESET_DEPTH` levels; ``None`` lifts the
    node limit (for graphs that were already checked)."""
    errors: list[dict[str, Any]] = []
    g = Graph()
    if not isinstance(raw, dict):
        return g, [err(None, "bad_graph", f"a graph must be a JSON object, got {type(raw).__name__}",
                       hint="send the graph JSON CodefyUI exports")]
    fv = raw.get("format_version", 1)
    if fv not in (1, "1"):
        errors.append(err(None, "bad_format_version", f"format_version {fv!r} is not supported (expected 1)"))
    nodes = raw.get("nodes")
    edges = raw.get("edges", [])
    if not isinstance(nodes, list):
        errors.append(err(None, "bad_graph", "'nodes' must be a list"))
        nodes = []
    if not isinstance(edges, list):
        errors.append(err(None, "bad_graph", "'edges' must be a list"))
        edges = []
    # CodefyUI's order: the installed presets (the registry) first, then the
    # graph's own embedded ones for names the registry does not have.
    g.presets = preset_index(raw.get("presets"), errors)
    g.presets.update(library or {})

    flat_nodes: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or not isinstance(n.get("id"), str) or not isinstance(n.get("type"), str):
            errors.append(err(None, "bad_node", f"nodes[{i}] needs a string 'id' and 'type'"))
            continue
        if n["type"] in ANNOTATION_TYPES:
            continue
        if n["id"] in seen:
            errors.append(err(n["id"], "duplicate_id", f"node id {n['id']!r} appears more than once"))
            continue
        seen.add(n["id"])
        data = n.get("data") or {}
        params = data.get("params") if isinstance(data, dict) else None
        if params is None:
            params = {}
        if not isinstance(params, dict):
            errors.append(err(n["id"], "bad_params", "data.params must be an object"))
            params = {}
        flat_nodes.append({"id": n["id"], "type": n["type"], "params": dict(params),
                           "internalParams": (data.get("internalParams") or {}) if isinstance(data, dict) else {},
                           "origin": n["id"]})
    # Only string ids and types: a list or object there is reported above, and is no set member.
    annotations = {n["id"] for n in nodes if isinstance(n, dict) and isinstance(n.get("id"), str)
                   and isinstance(n.get("type"), str) and n["type"] in ANNOTATION_TYPES}
    flat_edges: list[dict[str, Any]] = []
    for i, e in enumerate(edges):
        if not isinstance(e, dict) or not isinstance(e.get("source"), str) or not isinstance(e.get("target"), str):
            errors.append(err(None, "bad_edge", f"edges[{i}] needs string 'source' and 'target'"))
            continue
        if e["source"] in annotations or e["target"] in annotations:
            continue
        missing = [x for x in (e["source"], e["target"]) if x not in seen]
        if missing:
            errors.append(err(None, "bad_edge",
                              f"edge {e.get('id') or i!r} connects node {missing[0]!r}, which does not exist",
                              value=missing[0], hint="remove the edge or add the node"))
            continue
        flat_edges.append({"source": e["source"], "target": e["target"],
                           "sourceHandle": e.get("sourceHandle") or "", "targetHandle": e.get("targetHandle") or "",
                           "kind": _edge_kind(e)})

    check_size([n["type"] for n in flat_nodes], len(flat_edges), g.presets,
               max_nodes if max_nodes is not None else 1 << 62)
    # Expand presets, level by level (nested presets appear as inner nodes).
    for depth in range(MAX_PRESET_DEPTH + 1):
        if not any(n["type"].startswith(PRESET_PREFIX) for n in flat_nodes):
            break
        if depth == MAX_PRESET_DEPTH:
            errors.append(err(None, "preset_depth", f"presets nest deeper than {MAX_PRESET_DEPTH} levels"))
            flat_nodes = [n for n in flat_nodes if not n["type"].startswith(PRESET_PREFIX)]
            break
        flat_nodes, flat_edges = _expand_once(flat_nodes, flat_edges, g.presets, errors)

    for n in flat_nodes:
        g.nodes[n["id"]] = GNode(n["id"], n["type"], n["params"], n["origin"])
    for e in flat_edges:
        g.edges.append(GEdge(e["source"], e["target"], e["sourceHandle"], e["targetHandle"], e["kind"]))
    return g, errors


def _expand_once(nodes: list[dict[str, Any]], edges: list[dict[str, Any]],
                 presets: dict[str, dict[str, Any]],
                 errors: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Expand every preset node of one level; edges are remapped in one pass (linear, not per preset)."""
    out_nodes: list[dict[str, Any]] = []
    out_edges = list(edges)
    # preset node id -> (preset name, origin, exposed inputs, exposed outputs, entry nodes)
    expanded: dict[str, tuple[str, str, dict[Any, Any], dict[Any, Any], set[str]]] = {}
    for n in nodes:
        if not n["type"].startswith(PRESET_PREFIX):
            out_nodes.append(n)
            continue
        name = n["type"][len(PRESET_PREFIX):]
        preset = presets.get(name)
        if preset is None:
            errors.append(err(n["origin"], "unknown_preset",
                              f"node {n['origin']!r} uses preset {name!r}, which is not installed",
                              hint="add it to the graph's 'presets' list or to data/presets/"))
            continue
        pid = n["id"]
        overrides = n.get("internalParams") or {}
        inputs = {p.get("name"): (f"{pid}__{p.get('internal_node')}", p.get("internal_port"))
                  for p in preset.get("exposed_inputs", []) if isinstance(p, dict)}
        outputs = {p.get("name"): (f"{pid}__{p.get('internal_node')}", p.get("internal_port"))
                   for p in preset.get("exposed_outputs", []) if isinstance(p, dict)}
        inner_nodes = [i for i in preset.get("nodes", []) if isinstance(i, dict) and "id" in i and "type" in i]
        for inner in inner_nodes:
            params = copy.deepcopy(inner.get("params") or (inner.get("data") or {}).get("params") or {})
            params.update(overrides.get(inner["id"], {}) if isinstance(overrides, dict) else {})
            out_nodes.append({"id": f"{pid}__{inner['id']}", "type": inner["type"], "params": params,
                              "internalParams": (inner.get("data") or {}).get("internalParams") or {},
                              "origin": n["origin"]})
        for ie in preset.get("edges", []):
            if isinstance(ie, dict) and "source" in ie and "target" in ie:
                out_edges.append({"source": f"{pid}__{ie['source']}", "target": f"{pid}__{ie['target']}",
                                  "sourceHandle": ie.get("sourceHandle") or "",
                                  "targetHandle": ie.get("targetHandle") or "",
                                  "kind": _edge_kind(ie)})
        # A trigger into a preset triggers its entry nodes (those with no inner inputs).
        entry = {t for t, _ in inputs.values()} or {f"{pid}__{i['id']}" for i in inner_nodes[:1]}
        expanded[pid] = (name, n["origin"], inputs, outputs, entry)
    if not expanded:
        return out_nodes, out_edges
    remapped = []
    for e in out_edges:
        src = expanded.get(e["source"])
        dst = expanded.get(e["target"])
        if src is None and dst is None:
            remapped.append(e)
            continue
        e = dict(e)
        if src is not None:
            name, origin, _, outputs, _ = src
            if e["sourceHandle"] not in outputs:
                errors.append(err(origin, "bad_port", f"preset {name!r} has no output {e['sourceHandle']!r}"))
                continue
            e["source"], e["sourceHandle"] = outputs[e["sourceHandle"]]
        if dst is not None:
            name, origin, inputs, _, entry = dst
            if e["kind"] == "trigger":
                for t in sorted(entry):
                    remapped.append({**e, "target": t})
                continue
            if e["targetHandle"] not in inputs:
                errors.append(err(origin, "bad_port", f"preset {name!r} has no input {e['targetHandle']!r}"))
                continue
            e["target"], e["targetHandle"] = inputs[e["targetHandle"]]
        remapped.append(e)
    return out_nodes, remapped
