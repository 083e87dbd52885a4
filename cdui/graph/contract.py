"""The contract of a graph called as an API function, and filling it in.

The contract comes from the graph's **top-level** ``GraphInput`` /
``GraphOutput`` nodes only (ones inside presets are not part of it), as in
CodefyUI: names match ``^[a-zA-Z_][a-zA-Z0-9_]{0,63}$`` and are unique per side,
an input's type is one of string/number/integer/boolean/json/image and image
inputs are required; there is at least one GraphOutput; the graph has a Start
node, every GraphInput is the target of a trigger edge from it, and every
GraphOutput runs. A graph that breaks one of these cannot be called: the API
answers 409 with the reason (:class:`ContractError`).

:func:`fill_inputs` returns a copy of the graph with each caller's value
written, raw, into its GraphInput's ``value`` param; the node coerces it in the
run's process (cdui.nodes.builtin.graph_io). A published app's serving process
plans its version once and is sent only :func:`input_values`, which it writes
into the same params (cdui/run/served.py).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError
from cdui.nodes.builtin.graph_io import INPUT_TYPES

NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
_TRUE = {True, "true", "True", "1"}


class ContractError(CduiError):
    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(code, message, hint=hint or "fix the graph's GraphInput/GraphOutput nodes and save it again",
                         status=409)


@dataclass
class Contract:
    # name -> (node id, type, required, description)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # name -> node id
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [{"name": n, **{k: v for k, v in d.items() if k != "node_id"}}
                           for n, d in self.inputs.items()],
                "outputs": [{"name": n, **{k: v for k, v in d.items() if k != "node_id"}}
                            for n, d in self.outputs.items()]}


def _params(node: dict[str, Any]) -> dict[str, Any]:
    data = node.get("data") if isinstance(node.get("data"), dict) else {}
    params = data.get("params") if isinstance(data, dict) else None
    return params if isinstance(params, dict) else {}


def contract_of(graph: Any) -> Contract:
    """The graph's contract; raises :class:`ContractError` when it has none or a broken one."""
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ContractError("bad_graph", "the saved graph is not a graph object with a 'nodes' list")
    nodes = [n for n in graph["nodes"] if isinstance(n, dict) and isinstance(n.get("id"), str)]
    edges = [e for e in graph.get("edges") or [] if isinstance(e, dict)]
    c = Contract()
    for n in nodes:
        if n.get("type") not in ("GraphInput", "GraphOutput"):
            continue
        p = _params(n)
        is_input = n["type"] == "GraphInput"
        name = p.get("name", "input" if is_input else "output")
        side = c.inputs if is_input else c.outputs
        if not isinstance(name, str) or not NAME.match(name):
            raise ContractError("bad_contract", f"{n['type']} {n['id']!r} has the name {name!r}; a name starts "
                                f"with a letter or _ and has at most 64 letters, digits and _")
        if name in side:
            raise ContractError("bad_contract", f"two {n['type']} nodes are named {name!r} "
                                f"({side[name]['node_id']!r} and {n['id']!r}); names must be unique")
        if is_input:
            kind = p.get("type", "string")
            required = p.get("required", True) in _TRUE
            if kind not in INPUT_TYPES:
                raise ContractError("bad_contract", f"GraphInput {name!r} has type {kind!r}; use one of "
                                    f"{INPUT_TYPES}")
            if kind == "image" and not required:
                raise ContractError("bad_contract", f"GraphInput {name!r} is an image input that is not "
                                    f"required; image inputs must be required")
            side[name] = {"node_id": n["id"], "type": kind, "required": required,
                          "description": str(p.get("description") or "")}
        else:
            side[name] = {"node_id": n["id"], "description": str(p.get("description") or "")}
    if not c.outputs:
        raise ContractError("no_outputs", "the graph has no GraphOutput node, so a call would return nothing",
                            hint="add a GraphOutput node for each value the caller should get")
    starts = {n["id"] for n in nodes if n.get("type") == "Start"}
    if not starts:
        raise ContractError("no_entry_point", "the graph has no Start node, so nothing would run")
    triggered = {e.get("target") for e in edges if e.get("type") == "trigger" and e.get("source") in starts}
    for name, d in c.inputs.items():
        if d["node_id"] not in triggered:
            raise ContractError("untriggered_input", f"GraphInput {name!r} ({d['node_id']!r}) has no trigger edge "
                                f"from the Start node, so it would not run",
                                hint="connect the Start node's trigger to every GraphInput")
    reach = _reachable(nodes, edges, starts)
    for name, d in c.outputs.items():
        if d["node_id"] not in reach:
            raise ContractError("unreachable_output", f"GraphOutput {name!r} ({d['node_id']!r}) is not reached "
                                f"from the Start node, so it would not run",
                                hint="connect it to the nodes the Start node reaches")
    return c


def _reachable(nodes: list[dict[str, Any]], edges: list[dict[str, Any]], starts: set[str]) -> set[str]:
    fwd: dict[str, list[str]] = {}
    for e in edges:
        fwd.setdefault(str(e.get("source")), []).append(str(e.get("target")))
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(fwd.get(n, []))
    return seen


def input_values(contract: Contract, values: Any) -> dict[str, Any]:
    """The caller's ``values`` by the node id of their GraphInput (as given, not copied).

    Unknown names and missing required inputs are refused (400) naming them."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise CduiError("bad_inputs", f"inputs must be an object of name -> value, got {type(values).__name__}")
    unknown = sorted(set(values) - set(contract.inputs))
    if unknown:
        raise CduiError("bad_inputs", f"the graph has no input(s) {unknown}",
                        hint=f"its inputs are {sorted(contract.inputs) or 'none'}")
    missing = sorted(n for n, d in contract.inputs.items() if d["required"] and n not in values)
    if missing:
        raise CduiError("missing_inputs", f"required input(s) {missing} were not given",
                        hint="give a value for every required input in 'inputs'")
    return {contract.inputs[name]["node_id"]: value for name, value in values.items()}


def fill_inputs(graph: dict[str, Any], contract: Contract, values: Any) -> dict[str, Any]:
    """A copy of ``graph`` with the caller's ``values`` in their GraphInputs.

    Unknown names and missing required inputs are refused (400) naming them."""
    by_id = input_values(contract, values)
    # Only the GraphInputs given a value are copied (the node, its data and its params); every other part is
    # the given graph's own, shared, so neither may be changed in place afterwards.
    nodes = []
    for n in graph.get("nodes") or []:
        if isinstance(n, dict) and n.get("id") in by_id:
            data = n.get("data")
            data = dict(data) if isinstance(data, dict) else {}
            params = data.get("params")
            params = dict(params) if isinstance(params, dict) else {}
            params["value"] = copy.deepcopy(by_id[n["id"]])
            data["params"] = params
            n = {**n, "data": data}
        nodes.append(n)
    return {**graph, "nodes": nodes}
