"""Setting a node's params in a graph by ``NODE.PARAM`` (``cdui runs clone --param``, a sweep's variants).

One function for both, so a mistyped node or param is refused in the same words wherever it is
given: the node must be in the graph and the param one its type declares (the check of the value
itself, its type and bounds, is the graph validation's, :mod:`cdui.graph.validate`).
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from cdui.nodes.registry import Registry
from cdui.wire.sweepspec import text_value

__all__ = ["ParamError", "declared_of", "set_param", "split_key", "text_value"]


class ParamError(Exception):
    """A ``NODE.PARAM`` that cannot be set: ``message`` says why, ``hint`` what there is."""

    def __init__(self, message: str, hint: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint, self.node_id = message, hint, node_id


def split_key(key: str) -> tuple[str, str]:
    """``NODE.PARAM`` as (node id, param name); a node id may hold dots, the param is after the last."""
    node_id, dot, param = key.rpartition(".")
    if not dot or not node_id or not param:
        raise ParamError(f"{key!r} is not NODE.PARAM", "e.g. train.lr (the node's id, a dot, the param's name)")
    return node_id, param


def declared_of(registry: Registry, graph: Any) -> dict[str, list[str]]:
    """The params each node type of ``graph`` declares (a type this server lacks is left out: the
    graph validation names it)."""
    out: dict[str, list[str]] = {}
    for n in graph.get("nodes") or [] if isinstance(graph, dict) else []:
        t = str(n.get("type")) if isinstance(n, dict) else ""
        cls = registry.get(t)
        if cls is not None and t not in out:
            out[t] = [p.name for p in cls.define_params()]
    return out


def set_param(graph: dict[str, Any], key: str, value: Any, declared: Mapping[str, Sequence[str]]) -> Any:
    """Set ``key`` (``NODE.PARAM``) to ``value`` in ``graph``, in place; the value it had (the text
    ``(default)`` when unset). Raises :class:`ParamError` for an unknown node or a param the node's type
    does not declare, naming what there is."""
    node_id, param = split_key(key)
    nodes = {str(n.get("id")): n for n in graph.get("nodes") or [] if isinstance(n, dict)}
    node = nodes.get(node_id)
    if node is None:
        close = difflib.get_close_matches(node_id, list(nodes), 3)
        raise ParamError(f"the graph has no node {node_id!r}"
                         + (f"; did you mean {', '.join(close)}?" if close else ""),
                         f"its nodes: {', '.join(list(nodes)[:30])}")
    names = list(declared.get(str(node.get("type")), []))
    if names and param not in names:
        close = difflib.get_close_matches(param, names, 3)
        raise ParamError(f"node {node_id} ({node.get('type')}) has no param {param!r}"
                         + (f"; did you mean {', '.join(close)}?" if close else ""),
                         f"its params: {', '.join(names)}", node_id)
    # CodefyUI keeps a node's params under data.params (a bare params object is read too).
    data = node.get("data")
    params = data.setdefault("params", {}) if isinstance(data, dict) else node.get("params")
    if params is None:
        params = node.setdefault("data", {}).setdefault("params", {})
    if not isinstance(params, dict):
        raise ParamError(f"node {node_id}'s params are not an object in the graph", "fix the graph file", node_id)
    old = params.get(param, "(default)")
    params[param] = value
    return old
