"""fill_inputs (cdui/graph/contract.py): the caller's values in their GraphInputs, and the given graph
unchanged. A published app's snapshot is kept in memory and filled at every invoke, so a fill that
changed it would leak one caller's inputs into the next call."""
from __future__ import annotations

import json
from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.graph.contract import contract_of, fill_inputs


def graph() -> dict[str, Any]:
    return {"name": "g", "nodes": [
        {"id": "start", "type": "Start", "data": {"params": {}}},
        {"id": "x", "type": "GraphInput", "data": {"params": {"name": "x", "type": "json"}}},
        {"id": "y", "type": "GraphInput", "data": {"params": {"name": "y", "type": "number", "required": False,
                                                              "value": 7}}},
        {"id": "out", "type": "GraphOutput", "data": {"params": {"name": "out"}}}],
        "edges": [{"id": "t1", "source": "start", "target": "x", "type": "trigger"},
                  {"id": "t2", "source": "start", "target": "y", "type": "trigger"},
                  {"id": "d", "source": "x", "target": "out", "sourceHandle": "value", "targetHandle": "value"}]}


def test_the_values_go_into_their_inputs_and_the_given_graph_stays_as_it_was() -> None:
    g = graph()
    before = json.dumps(g, sort_keys=True)
    contract = contract_of(g)
    value = {"features": [5.1, 3.5, 1.4, 0.2]}
    filled = fill_inputs(g, contract, {"x": value})
    nodes = {n["id"]: n for n in filled["nodes"]}
    assert nodes["x"]["data"]["params"] == {"name": "x", "type": "json", "value": value}
    assert nodes["y"]["data"]["params"]["value"] == 7  # not given: its own default stays
    assert json.dumps(g, sort_keys=True) == before, "the given graph was changed"
    value["features"].append(9.9)  # the caller's object is not shared with the filled graph
    assert nodes["x"]["data"]["params"]["value"] == {"features": [5.1, 3.5, 1.4, 0.2]}
    # A second fill of the same graph sees none of the first caller's values.
    again = fill_inputs(g, contract, {"x": 1, "y": 2})
    nodes = {n["id"]: n for n in again["nodes"]}
    assert (nodes["x"]["data"]["params"]["value"], nodes["y"]["data"]["params"]["value"]) == (1, 2)
    assert json.dumps(g, sort_keys=True) == before
    assert filled["edges"] == g["edges"] and filled["name"] == "g"


def test_unknown_and_missing_inputs_are_refused_by_name() -> None:
    g = graph()
    with pytest.raises(CduiError) as exc:
        fill_inputs(g, contract_of(g), {"x": 1, "z": 2})
    assert exc.value.code == "bad_inputs" and "['z']" in exc.value.message
    with pytest.raises(CduiError) as exc:
        fill_inputs(g, contract_of(g), {})
    assert exc.value.code == "missing_inputs" and "['x']" in exc.value.message
