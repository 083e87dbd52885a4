"""Where each node of a graph is drawn in the run view: a pure function of the graph.

The graph's own positions (CodefyUI's editor stores ``position: {x, y}``)
are kept when they place the nodes apart; otherwise (no positions, or every
node at one point, as a graph written by hand) nodes are put in layers by
their longest path from a node with no inputs, in the order they were given.
Only ids, types, positions and edges come out: never a param, so no secret.
"""
from __future__ import annotations

import math
from typing import Any

LAYER_GAP, ROW_GAP = 190.0, 70.0
MAX_TEXT = 256


def _pos(node: dict[str, Any]) -> tuple[float, float] | None:
    p = node.get("position")
    if not isinstance(p, dict):
        return None
    x, y = p.get("x"), p.get("y")
    if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, (int, float)) \
            or not isinstance(y, (int, float)) or not (math.isfinite(x) and math.isfinite(y)):
        return None
    return float(x), float(y)


def _layers(ids: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layer of every node; a cycle (refused at submit anyway) cannot loop forever."""
    layer = dict.fromkeys(ids, 0)
    for _ in range(len(ids)):
        changed = False
        for src, dst in edges:
            if layer[dst] < layer[src] + 1:
                layer[dst] = layer[src] + 1
                changed = True
        if not changed:
            break
    return layer


def drawing(graph: Any) -> dict[str, Any]:
    """``{"nodes": [{"id", "type", "x", "y"}], "edges": [{"source", "target"}], "placed": "graph"|"layers"}``."""
    raw_nodes = graph.get("nodes") if isinstance(graph, dict) else None
    raw_edges = graph.get("edges") if isinstance(graph, dict) else None
    nodes = [n for n in raw_nodes if isinstance(n, dict) and isinstance(n.get("id"), str)] \
        if isinstance(raw_nodes, list) else []
    ids = [n["id"][:MAX_TEXT] for n in nodes]
    known = set(ids)
    edges = []
    for e in raw_edges if isinstance(raw_edges, list) else []:
        if isinstance(e, dict) and e.get("source") in known and e.get("target") in known \
                and e["source"] != e["target"]:
            edges.append((str(e["source"]), str(e["target"])))
    edges = list(dict.fromkeys(edges))
    positions = [_pos(n) for n in nodes]
    own = all(p is not None for p in positions) and len({p for p in positions}) == len(positions) > 0
    out_nodes: list[dict[str, Any]] = []
    if own:
        for nid, n, p in zip(ids, nodes, positions, strict=True):
            assert p is not None
            out_nodes.append({"id": nid, "type": str(n.get("type", ""))[:MAX_TEXT], "x": p[0], "y": p[1]})
    else:
        layer = _layers(ids, edges)
        rows: dict[int, int] = {}
        for nid, n in zip(ids, nodes, strict=True):
            row = rows.get(layer[nid], 0)
            rows[layer[nid]] = row + 1
            out_nodes.append({"id": nid, "type": str(n.get("type", ""))[:MAX_TEXT],
                              "x": layer[nid] * LAYER_GAP, "y": row * ROW_GAP})
    return {"nodes": out_nodes, "edges": [{"source": s, "target": t} for s, t in edges],
            "placed": "graph" if own else "layers"}
