"""presets_used: which installed presets a submitted graph brings along, as a table."""
from __future__ import annotations

from typing import Any

import pytest

from cdui.graph.uses import presets_used


def _n(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "data": {"params": params}}


LIB = {
    "norm": {"preset_name": "norm", "nodes": [_n("a", "Print")]},
    "outer": {"preset_name": "outer", "nodes": [_n("b", "preset:norm")]},
    "mapped": {"preset_name": "mapped", "nodes": [_n("c", "Print")]},
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
]


@pytest.mark.parametrize("graph,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_presets_used(graph: dict[str, Any], expected: set[str]) -> None:
    assert presets_used(graph, LIB) == expected
