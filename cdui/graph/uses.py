"""Which presets a graph uses, read from its nodes rather than from its JSON text.

A preset is used by a node whose type is ``preset:<name>`` and by a node that
runs one by name (Map's ``subgraph`` param; ``preset`` / ``preset_name`` for
nodes that call it that). Presets the graph embeds are walked too, and so is
every library preset found on the way, so a preset that uses another brings it
along. A name that merely appears somewhere (a label, a file name) is no use.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdui.graph.model import PRESET_PREFIX

# params by which a node runs a preset by name (cdui.nodes.builtin.compose.Map: subgraph)
PRESET_PARAMS = ("subgraph", "preset", "preset_name")


def _node_params(node: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    data = node.get("data")
    for params in (node.get("params"), data.get("params") if isinstance(data, dict) else None):
        if isinstance(params, dict):
            yield params


def _names_in(nodes: Any) -> set[str]:
    names: set[str] = set()
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict):
            continue
        ntype = node.get("type")
        if isinstance(ntype, str) and ntype.startswith(PRESET_PREFIX):
            names.add(ntype.removeprefix(PRESET_PREFIX))
        for params in _node_params(node):
            for key in PRESET_PARAMS:
                value = params.get(key)
                if isinstance(value, str) and value.strip():
                    names.add(value.strip().removeprefix(PRESET_PREFIX))
    return names


def presets_used(graph: Mapping[str, Any], library: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Names of the presets ``graph`` uses, directly or through a preset it uses."""
    own = [p for p in graph.get("presets") or [] if isinstance(p, dict)]
    found = _names_in(graph.get("nodes"))
    for preset in own:
        found |= _names_in(preset.get("nodes"))
    todo = [n for n in found if n in library]
    while todo:
        name = todo.pop()
        for inner in _names_in(library[name].get("nodes")) - found:
            found.add(inner)
            if inner in library:
                todo.append(inner)
    return found
