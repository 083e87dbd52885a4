"""Checking many variants of one graph quickly: the variants of a sweep differ only in a few params.

A variant's graph is its sweep's graph with some ``NODE.PARAM`` set (:func:`cdui.graph.params.set_param`).
When every swept param is a plain value of a node of an installed type (a number, a bool, text or a choice:
not a file or folder, nothing written, no preset run by name, no secret) on a node whose outputs do not
depend on its params, what a variant changes in the graph's validation is that node's own checks
(:func:`cdui.graph.validate.check_node`) and nothing else: the wiring, the nodes that run, the presets, the
files and the secrets are the same for every variant. So one variant is checked in full, as a run is, and
every other variant only through the checks of the nodes it changes, each distinct set of a node's values
once: the same rules and the same error objects, about a thousand times less work for a large grid.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from cdui.core.layout import Layout
from cdui.graph.model import parse
from cdui.graph.params import split_key
from cdui.graph.validate import _reachable, check_node
from cdui.nodes.base import Node
from cdui.nodes.registry import Registry

# Param types whose value only the node's own checks read (file, folder, output and secret types are
# read by the file plan, the read roots and the secret split too).
PLAIN_TYPES = ("int", "float", "bool", "string", "select")


class VariantChecker:
    """The node-level checks of a graph's variants. ``fast`` is False when a swept param is not plain (see
    the module's docstring): every variant must then be checked in full."""

    def __init__(self, graph: dict[str, Any], keys: Iterable[str], registry: Registry,
                 library: dict[str, dict[str, Any]], max_nodes: int, layout: Layout | None) -> None:
        self.keys = frozenset(keys)
        self.layout = layout
        self._cache: dict[str, list[dict[str, Any]]] = {}
        self.nodes: dict[str, tuple[type[Node], str, dict[str, Any]]] = {}  # node id -> (class, type, raw params)
        self.fast = self._plain(graph, list(self.keys), registry, library, max_nodes)

    def _plain(self, graph: dict[str, Any], keys: list[str], registry: Registry,
               library: dict[str, dict[str, Any]], max_nodes: int) -> bool:
        raw_nodes = [n for n in graph.get("nodes") or [] if isinstance(n, dict)]
        by_id: dict[str, list[dict[str, Any]]] = {}
        for n in raw_nodes:
            by_id.setdefault(str(n.get("id")), []).append(n)
        g, _ = parse(graph, library, max_nodes)
        keep = _reachable(g)
        for key in keys:
            node_id, param = split_key(key)
            found = by_id.get(node_id) or []
            if len(found) != 1:
                return False
            node = found[0]
            data = node.get("data")
            # set_param writes where parse reads: data.params (a node without a data object is left to the full check)
            if not isinstance(data, dict) or not isinstance(data.get("params", {}), dict):
                return False
            cls = registry.get(str(node.get("type")))
            if cls is None or getattr(cls, "dynamic_output", None) is not None:
                return False
            p = next((p for p in cls.define_params() if p.name == param), None)
            if p is None or p.param_type not in PLAIN_TYPES or p.writes or p.runs_preset:
                return False
            gn = g.nodes.get(node_id)
            if gn is None or gn.origin != node_id:
                return False
            if node_id in keep:  # a node that does not run is not checked, whatever its params
                self.nodes[node_id] = (cls, gn.type, gn.params)
        return True

    def node_errors(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The errors of the node-level checks of every running node a variant's ``params`` change, with
        those params set (each node's other params as the graph has them)."""
        by_node: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            node_id, param = split_key(key)
            if node_id in self.nodes:
                by_node.setdefault(node_id, {})[param] = value
        out: list[dict[str, Any]] = []
        for node_id, values in by_node.items():
            memo = node_id + "\0" + json.dumps(values, sort_keys=True, default=repr)
            errors = self._cache.get(memo)
            if errors is None:
                cls, type_name, raw = self.nodes[node_id]
                errors = []
                check_node(cls, type_name, {**raw, **values}, node_id, errors, self.layout)
                self._cache[memo] = errors
            out += errors
        return out
