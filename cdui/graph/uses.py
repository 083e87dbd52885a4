"""Which presets a graph uses, read from its nodes rather than from its JSON text.

A preset is used by a node whose type is ``preset:<name>`` and by a node that
runs one by name: a param its node type declares ``runs_preset`` (Map's
``subgraph``), looked up through ``preset_params`` (the registry's), so a param
that is merely called ``preset`` (Conv2dKernel's filter) names no preset.
Presets the graph embeds are walked too, and so is every library preset found
on the way, so a preset that uses another brings it along. A name that merely
appears somewhere (a label, a file name) is no use.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cdui.graph.model import PRESET_PREFIX

# node type -> the params by which it runs a preset by name (Registry.preset_params)
PresetParams = Callable[[str], Iterable[str]]


def _node_params(node: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    data = node.get("data")
    for params in (node.get("params"), data.get("params") if isinstance(data, dict) else None):
        if isinstance(params, dict):
            yield params


def _names_in(nodes: Any, preset_params: PresetParams) -> set[str]:
    names: set[str] = set()
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict):
            continue
        ntype = node.get("type")
        if not isinstance(ntype, str):
            continue
        if ntype.startswith(PRESET_PREFIX):
            names.add(ntype.removeprefix(PRESET_PREFIX))
            continue
        keys = tuple(preset_params(ntype))
        for params in _node_params(node) if keys else ():
            for key in keys:
                value = params.get(key)
                if isinstance(value, str) and value.strip():
                    names.add(value.strip().removeprefix(PRESET_PREFIX))
    return names


def presets_used(graph: Mapping[str, Any], library: Mapping[str, Mapping[str, Any]],
                 preset_params: PresetParams) -> set[str]:
    """Names of the presets ``graph`` uses, directly or through a preset it uses."""
    own = [p for p in graph.get("presets") or [] if isinstance(p, dict)]
    found = _names_in(graph.get("nodes"), preset_params)
    for preset in own:
        found |= _names_in(preset.get("nodes"), preset_params)
    todo = [n for n in found if n in library]
    while todo:
        name = todo.pop()
        for inner in _names_in(library[name].get("nodes"), preset_params) - found:
            found.add(inner)
            if inner in library:
                todo.append(inner)
    return found
