"""Validation and planning: from parsed graph to an ordered execution plan.

Every error is collected and returned at once (never the first only, never a
stack trace): unknown type or preset, missing required input, bad port, type
mismatch, out-of-range or ill-typed param, cycle, no entry point.

Which nodes run: those a ``Start`` node reaches (through trigger edges, then
onward through any edge), plus whatever feeds them data. Everything else is a
draft and is pruned without complaint.
"""
from __future__ import annotations

import builtins
import difflib
import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from typing import Any

from cdui.core.layout import Layout
from cdui.graph.model import DEFAULT_MAX_NODES, GEdge, Graph, err, parse
from cdui.nodes.base import ANY, IMAGE, TENSOR, TRIGGER, Node, Param, Port
from cdui.nodes.codefyui_names import CODEFYUI_BUILTINS
from cdui.nodes.registry import Registry

START_TYPE = "Start"


def is_compatible(source: str, target: str) -> bool:
    """CodefyUI's port type rules: equal types, anything into ANY, ANY into
    anything, IMAGE into TENSOR; TRIGGER only with TRIGGER."""
    if source == TRIGGER or target == TRIGGER:
        return source == target
    if source == target or source == ANY or target == ANY:
        return True
    return source == IMAGE and target == TENSOR


@dataclass
class PlanNode:
    id: str
    type: str
    cls: builtins.type[Node]  # builtins.: the field `type` above shadows the builtin here
    params: dict[str, Any]
    origin: str
    # input port -> (source node id, source port)
    inputs: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass
class Plan:
    order: list[PlanNode]
    presets: dict[str, dict[str, Any]]
    pruned: list[str]


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
    try:
        return int(float(value)) if isinstance(value, str) and value.strip() else int(value)
    except OverflowError:  # "1e999" or a JSON Infinity: not an integer at all
        raise ValueError from None


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError
    v = float(value)
    if not math.isfinite(v):  # "nan", JSON NaN/Infinity: no node means them, and every range check passes them
        raise ValueError
    return v


def _to_string(value: Any) -> Any:
    # A number is kept as given (CodefyUI graphs carry "3" and 3 alike); a list or object is no text.
    if isinstance(value, (list, dict)):
        raise TypeError
    return value


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError


# How a declared param type turns a JSON value into the value a node gets; each raises
# TypeError/ValueError for a value that is not of the type. Types not here pass through
# (select is checked against its options, not converted).
COERCE: dict[str, Callable[[Any], Any]] = {"int": _to_int, "float": _to_float, "bool": _to_bool,
                                            "string": _to_string}


def coerce_param(p: Param, value: Any, node_id: str, errors: list[dict[str, Any]]) -> Any:
    """Coerce one param value to its declared type; record an error if impossible."""
    t = p.param_type
    if value is None:
        return value
    if t == "select":
        if p.options and str(value) not in [str(o) for o in p.options]:
            errors.append(err(node_id, "bad_param", f"{p.name}={value!r} is not one of {p.options}",
                              param=p.name, value=value))
        return value
    convert = COERCE.get(t)
    if convert is None:
        return value
    try:
        v = convert(value)
    except (TypeError, ValueError):
        errors.append(err(node_id, "bad_param", f"{p.name}={value!r} is not a valid {t}",
                          param=p.name, value=value, hint=f"give a {t} value"))
        return value
    if t in ("int", "float"):
        if p.min_value is not None and v < p.min_value:
            errors.append(err(node_id, "param_out_of_range", f"{p.name}={v!r} is below the minimum {p.min_value}",
                              param=p.name, value=value))
        if p.max_value is not None and v > p.max_value:
            errors.append(err(node_id, "param_out_of_range", f"{p.name}={v!r} is above the maximum {p.max_value}",
                              param=p.name, value=value))
    return v


def resolve_params(cls: type[Node], raw: dict[str, Any], node_id: str,
                   errors: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(raw)
    for p in cls.define_params():
        value = raw[p.name] if p.name in raw else p.when_absent()
        if p.required and (value is None or value == ""):
            errors.append(err(node_id, "missing_param", f"param {p.name!r} is required", param=p.name))
        out[p.name] = coerce_param(p, value, node_id, errors)
    return out


def check_node(cls: type[Node], type_name: str, raw: dict[str, Any], origin: str, errors: list[dict[str, Any]],
               layout: Layout | None = None) -> dict[str, Any]:
    """Every check of one node's own params (types, bounds, options, required, the node's own checks across
    its params, and with ``layout`` what it needs on that machine); its resolved params. A sweep checks its
    variants' params with this alone once the rest of the graph has passed (cdui/plane/sweeps.py)."""
    before = len(errors)
    params = resolve_params(cls, raw, origin, errors)
    if len(errors) == before:  # a param already refused for its type is not refused again for its value
        for name, message in cls.check_params(params):
            errors.append(err(origin, "bad_param", message, param=name, value=params.get(name)))
    if layout is not None:
        for code, message in cls.preflight(params, layout):
            errors.append(err(origin, code, f"{type_name} {origin!r}: {message}"))
    return params


def preflight_errors(plan: Plan, layout: Layout) -> list[dict[str, Any]]:
    """:func:`check_node`'s check of what each planned node needs on the machine (``layout``) alone: a serving
    process plans its version once and checks this again at each invoke (cdui/run/served.py)."""
    errors: list[dict[str, Any]] = []
    for pn in plan.order:
        for code, message in pn.cls.preflight(pn.params, layout):
            errors.append(err(pn.origin, code, f"{pn.type} {pn.origin!r}: {message}"))
    return errors


def _reachable(g: Graph) -> set[str]:
    starts = [n.id for n in g.nodes.values() if n.type == START_TYPE]
    fwd: dict[str, list[str]] = defaultdict(list)
    back_data: dict[str, list[str]] = defaultdict(list)
    for e in g.edges:
        fwd[e.source].append(e.target)
        if e.kind == "data":
            back_data[e.target].append(e.source)
    seen: set[str] = set()
    q = deque(starts)
    while q:
        n = q.popleft()
        if n in seen:
            continue
        seen.add(n)
        q.extend(fwd[n])
    # Upstream data dependencies of anything that runs also run.
    q = deque(seen)
    while q:
        n = q.popleft()
        for s in back_data[n]:
            if s not in seen:
                seen.add(s)
                q.append(s)
    return {n for n in seen if n in g.nodes}


def build_plan(g: Graph, registry: Registry, keep: set[str] | None = None,
               errors: list[dict[str, Any]] | None = None,
               external_inputs: Set[tuple[str, str]] = frozenset(), layout: Layout | None = None) -> Plan:
    """Validate ``g`` restricted to ``keep`` and return the plan (errors appended).

    With ``layout`` (the folders of the machine that will run it), each node's
    :meth:`~cdui.nodes.base.Node.preflight` is checked too."""
    errors = [] if errors is None else errors
    keep = set(g.nodes) if keep is None else keep
    plan_nodes: dict[str, PlanNode] = {}
    unknown: set[str] = set()
    for nid in sorted(keep, key=list(g.nodes).index):
        n = g.nodes[nid]
        cls = registry.get(n.type)
        if cls is None:
            unknown.add(nid)
            errors.append(unknown_type_error(n.origin, n.type, registry.nodes))
            continue
        plan_nodes[nid] = PlanNode(nid, n.type, cls, check_node(cls, n.type, n.params, n.origin, errors, layout),
                                   n.origin)

    edges = [e for e in g.edges if e.source in keep and e.target in keep]
    # An input fed by an edge from a node of unknown type (or from a preset that
    # could not be expanded, whose node is gone), or by an edge reported below as
    # wrong, is not also reported as missing: that one cause is the one to fix.
    fed_by_unknown = {(e.target, e.target_handle) for e in g.edges
                      if e.source in unknown or e.source not in g.nodes}
    for e in edges:
        src, dst = plan_nodes.get(e.source), plan_nodes.get(e.target)
        if src is None or dst is None:
            continue
        if e.kind == "trigger":
            continue
        outs = {p.name: p for p in src.cls.define_outputs()}
        ins = {p.name: p for p in dst.cls.define_inputs()}
        ok = True
        out_port = _output_port(src, outs, e.source_handle)
        if out_port is None:
            errors.append(err(src.origin, "bad_port", f"{src.type} {src.origin!r} has no output {e.source_handle!r}",
                              value=e.source_handle, hint=f"outputs are {_output_names(src, outs)}"))
            ok = False
        if e.target_handle not in ins:
            errors.append(err(dst.origin, "bad_port", f"{dst.type} {dst.origin!r} has no input {e.target_handle!r}",
                              value=e.target_handle, hint=f"inputs are {sorted(ins)}"))
            ok = False
        if not ok or out_port is None:
            fed_by_unknown.add((e.target, e.target_handle))  # the bad edge is the error to fix
            continue
        st, tt = out_port.data_type, ins[e.target_handle].data_type
        if not is_compatible(st, tt):
            errors.append(err(dst.origin, "type_mismatch",
                              f"{src.origin}.{e.source_handle} ({st}) cannot connect to "
                              f"{dst.origin}.{e.target_handle} ({tt})",
                              value=[st, tt]))
            fed_by_unknown.add((e.target, e.target_handle))
            continue
        # Several edges into one input: the later one in the graph's edge list
        # wins, as in CodefyUI (its DQN and PPO examples rely on it).
        dst.inputs[e.target_handle] = (e.source, e.source_handle)

    for pn in plan_nodes.values():
        for port in pn.cls.define_inputs():
            if port.data_type == TRIGGER or port.optional:
                continue
            if (pn.id, port.name) in fed_by_unknown:
                continue
            if port.name not in pn.inputs and (pn.id, port.name) not in external_inputs:
                errors.append(err(pn.origin, "missing_input",
                                  f"{pn.type} {pn.origin!r} needs input {port.name!r} ({port.data_type})",
                                  value=port.name, hint="connect an edge to it"))

    order = _toposort(plan_nodes, edges, errors)
    return Plan(order, g.presets, [n for n in g.nodes if n not in keep])


def _output_port(pn: PlanNode, declared: dict[str, Port], name: str) -> Port | None:
    """The output ``name`` of ``pn``, or None. A node whose outputs depend on its params
    (Split's ``chunk_<i>``) decides for every name, the declared ones included: with
    ``chunks=1`` Split has no ``chunk_1``, although its catalog lists it."""
    check = getattr(pn.cls, "dynamic_output", None)
    if check is None:
        return declared.get(name)
    if not check(name, pn.params):
        return None
    return declared.get(name) or Port(name, TENSOR)


def _output_names(pn: PlanNode, declared: dict[str, Port]) -> list[str]:
    """The outputs ``pn`` has with its params, for the hint of a bad port."""
    names = getattr(pn.cls, "output_names", None)
    return list(names(pn.params)) if names is not None else sorted(declared)


def close_type(type_name: str, known: Iterable[str]) -> str | None:
    """The installed type a mistyped ``type_name`` most likely means (case aside), or None."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(type_name.lower(), list(by_lower), 1, 0.75)
    return by_lower[close[0]] if close else None


def unknown_type_error(node_id: str, type_name: str, known: Iterable[str] = ()) -> dict[str, Any]:
    """The error for a node whose type is not installed, saying which kind of
    type it is, so the user knows what to install or change; with a "did you
    mean" when an installed type (of ``known``) is spelled nearly the same."""
    known = list(known)
    guess = close_type(type_name, known)
    mean = f"did you mean {guess!r}? else " if guess is not None else ""
    if ":" in type_name:
        pack = type_name.split(":", 1)[0]
        if any(k.startswith(pack + ":") for k in known):
            # The pack is here, this one node of it is not: one of its node files failed to load.
            return err(node_id, "unknown_type", f"node {node_id!r} has type {type_name!r}: the plugin pack "
                       f"{pack!r} is installed but has no node of that name here (one of its node files may "
                       f"have failed to load)", value=type_name,
                       hint=f"{mean}see the load errors `cdui plugin reload` prints (GET /api/plugins) or the "
                            "server log; fix or update the pack, or remove the node")
        return err(node_id, "unknown_type", f"node {node_id!r} has type {type_name!r}, a node of the "
                   f"plugin pack {pack!r}, which is not installed", value=type_name,
                   hint=f"{mean}install the pack with `cdui plugin install {pack}` (a folder, an archive, "
                        f"or its name in CODEFYUI_PLUGIN_SOURCES), or remove the node")
    if type_name in CODEFYUI_BUILTINS:
        return err(node_id, "unknown_type", f"node {node_id!r} has type {type_name!r}, a CodefyUI "
                   f"built-in that this version of cdui does not have yet", value=type_name,
                   hint="see docs/graphs-and-nodes.md for the types cdui runs; replace the node "
                        "or run the graph in CodefyUI")
    return err(node_id, "unknown_type", f"node {node_id!r} has type {type_name!r}, which is not a "
               f"CodefyUI built-in: a custom node that is not installed here", value=type_name,
               hint=f"{mean}put the custom node's .py file in the custom_nodes folder and restart, "
                    "or remove the node")


def _toposort(nodes: dict[str, PlanNode], edges: list[GEdge], errors: list[dict[str, Any]]) -> list[PlanNode]:
    indeg = {n: 0 for n in nodes}
    fwd: dict[str, list[str]] = defaultdict(list)
    for e in edges:
        if e.source in nodes and e.target in nodes:
            fwd[e.source].append(e.target)
            indeg[e.target] += 1
    ready = deque(n for n in nodes if indeg[n] == 0)
    out: list[PlanNode] = []
    while ready:
        n = ready.popleft()
        out.append(nodes[n])
        for t in fwd[n]:
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(t)
    if len(out) < len(nodes):
        stuck = sorted(n for n, d in indeg.items() if d > 0)
        errors.append(err(stuck[0], "cycle", f"nodes {stuck} form a cycle", value=stuck,
                          hint="remove one edge of the loop"))
    return out


def validate_graph(raw: Any, registry: Registry, library: dict[str, dict[str, Any]] | None = None,
                   max_nodes: int = DEFAULT_MAX_NODES,
                   layout: Layout | None = None) -> tuple[Plan | None, list[dict[str, Any]]]:
    """Parse, expand, prune and validate. Returns (plan, errors); plan is None on errors.

    Raises ``graph_too_large`` before expanding past ``max_nodes`` nodes. With
    ``layout``, also what each node needs on that machine (see build_plan)."""
    g, errors = parse(raw, library, max_nodes)
    if not any(n.type == START_TYPE for n in g.nodes.values()):
        errors.append(err(None, "no_entry_point", "the graph has no Start node, so nothing would run",
                          hint="add a Start node and connect its trigger to the first node"))
    keep = _reachable(g)
    if not errors and keep <= {n.id for n in g.nodes.values() if n.type == START_TYPE}:
        errors.append(err(None, "no_entry_point", "no node is connected to a Start node",
                          hint="connect the Start node's trigger to the first node"))
    plan = build_plan(g, registry, keep, errors, layout=layout)
    _check_map_presets(plan, errors)
    return (None if errors else plan), errors


def _check_map_presets(plan: Plan, errors: list[dict[str, Any]]) -> None:
    # Only params declared ``runs_preset`` name a preset (Map's subgraph); a param that is merely
    # called "preset" (Conv2dKernel's built-in filters) is the node's own value.
    for pn in plan.order:
        for pname in pn.cls.preset_params():
            if pn.params.get(pname):
                name = str(pn.params[pname]).removeprefix("preset:")
                if name not in plan.presets:
                    errors.append(err(pn.origin, "unknown_preset",
                                      f"{pn.type} {pn.origin!r} runs preset {name!r}, which is not installed",
                                      value=name, hint="add it to the graph's 'presets' list or to data/presets/, "
                                      f"or name an installed one in {pname!r}"))

