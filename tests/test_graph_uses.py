"""presets_used: which installed presets a submitted graph brings along, as a table."""
from __future__ import annotations

from typing import Any

import pytest

from cdui.graph.uses import presets_used
from cdui.nodes.registry import build_registry

# Which params run a preset is read from the node types' declarations (Map's subgraph).
PRESET_PARAMS = build_registry().preset_params


def _n(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "data": {"params": params}}


LIB = {
    "norm": {"preset_name": "norm", "nodes": [_n("a", "Print")]},
    "outer": {"preset_name": "outer", "nodes": [_n("b", "preset:norm")]},
    "mapped": {"preset_name": "mapped", "nodes": [_n("c", "Print")]},
    "Sharpen3x3": {"preset_name": "Sharpen3x3", "nodes": [_n("d", "Print")]},
}

CASES = [
    ("a preset node", {"nodes": [_n("p", "preset:norm")]}, {"norm"}),
    ("Map's subgraph param", {"nodes": [_n("m", "Map", subgraph="mapped")]}, {"mapped"}),
    ("Map naming it with the prefix", {"nodes": [_n("m", "Map", subgraph="preset:mapped")]}, {"mapped"}),
    ("a preset inside a library preset", {"nodes": [_n("p", "preset:outer")]}, {"outer", "norm"}),
    ("inside the graph's own preset", {"nodes": [_n("p", "preset:own")],
                                       "presets": [{"preset_name": "own", "nodes": [_n("x", "preset:norm")]}]},
     {"own", "norm"}),
    # the old substring search took any quoted "norm" for a use of the preset
    ("the name only as a label", {"nodes": [_n("t", "Print", label="norm")], "name": "norm"}, set()),
    ("the name in a file path", {"nodes": [_n("r", "CSVReader", path="norm")]}, set()),
    ("no nodes", {}, set()),
    # Conv2dKernel's own param called "preset" picks a built-in filter; it runs no preset
    ("a node's own param called preset", {"nodes": [_n("k", "Conv2dKernel", preset="Sharpen3x3")]}, set()),
    ("a type that declares no preset param", {"nodes": [_n("x", "Print", subgraph="mapped")]}, set()),
]


@pytest.mark.parametrize("graph,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_presets_used(graph: dict[str, Any], expected: set[str]) -> None:
    assert presets_used(graph, LIB, PRESET_PARAMS) == expected
