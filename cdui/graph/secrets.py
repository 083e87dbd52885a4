"""SECRET param values: taken out of every stored copy, put back in memory only.

``split_secrets(graph, registry)`` returns a deep copy of the graph with every
``secret``-typed param blanked, and the list of ``(path, value)`` pairs that
were removed. ``fill_secrets(graph, secrets)`` puts them back (in the run
subprocess, which gets them on its stdin pipe, never argv or environment).
Secrets in preset ``internalParams`` and in the graph's own ``presets[]`` are
found too.
"""
from __future__ import annotations

import copy
from typing import Any

from cdui.nodes.registry import Registry

Path_ = list[Any]


def _secret_names(registry: Registry, node_type: str) -> set[str]:
    cls = registry.get(node_type)
    if cls is None:
        return set()
    return {p.name for p in cls.define_params() if p.param_type == "secret"}


def split_secrets(graph: Any, registry: Registry) -> tuple[Any, list[tuple[Path_, Any]]]:
    g = copy.deepcopy(graph)
    found: list[tuple[Path_, Any]] = []
    if not isinstance(g, dict):
        return g, found
    presets = {str(p.get("preset_name") or p.get("name")): p for p in g.get("presets") or []
               if isinstance(p, dict)}

    def scrub(params: Any, names: set[str], path: Path_) -> None:
        if not isinstance(params, dict):
            return
        for name in names:
            if params.get(name) not in (None, ""):
                found.append((path + [name], params[name]))
                params[name] = ""

    for i, n in enumerate(g.get("nodes") or []):
        if not isinstance(n, dict) or not isinstance(n.get("type"), str):
            continue
        data = n.get("data")
        if not isinstance(data, dict):
            continue
        scrub(data.get("params"), _secret_names(registry, n["type"]), ["nodes", i, "data", "params"])
        if n["type"].startswith("preset:") and isinstance(data.get("internalParams"), dict):
            preset = presets.get(n["type"][7:]) or {}
            inner_types = {x.get("id"): x.get("type") for x in preset.get("nodes", []) if isinstance(x, dict)}
            for inner_id, params in data["internalParams"].items():
                names = _secret_names(registry, str(inner_types.get(inner_id, "")))
                if not inner_types:  # unknown preset: scrub any param whose name says secret
                    names = {k for k in (params or {}) if "key" in k.lower() or "secret" in k.lower() or "token" in k.lower()}
                scrub(params, names, ["nodes", i, "data", "internalParams", inner_id])
    for j, p in enumerate(g.get("presets") or []):
        if not isinstance(p, dict):
            continue
        for k, inner in enumerate(p.get("nodes") or []):
            if isinstance(inner, dict) and isinstance(inner.get("type"), str):
                scrub(inner.get("params"), _secret_names(registry, inner["type"]), ["presets", j, "nodes", k, "params"])
    return g, found


def fill_secrets(graph: Any, secrets: list[tuple[Path_, Any]]) -> Any:
    g = copy.deepcopy(graph)
    for path, value in secrets:
        target = g
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    return g


def redact_text(text: str, secrets: list[tuple[Path_, Any]]) -> str:
    """Blank any secret value that appears in a log line or error message."""
    for _, value in secrets:
        if isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, "***")
    return text
