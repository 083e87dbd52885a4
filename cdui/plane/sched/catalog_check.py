"""The control plane's checks of a worker's node catalog against its own (pure).

:func:`compare` says whether a worker is degraded and which types it lacks or has extra;
:func:`any_refusal` keeps degraded-lacking workers and workers without a catalog out of
``any``; :func:`missing_types` lists the types a graph uses that a worker lacks, after
expanding presets, subgraphs and the presets Map nodes run. The catalogs themselves come
from :mod:`cdui.run.catalog` (a machine's own) and a worker's hello (bounded by
:mod:`cdui.wire.protocol`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError
from cdui.graph.model import PRESET_PREFIX
from cdui.graph.uses import PresetParams, presets_used


@dataclass(frozen=True)
class CatalogState:
    """A worker's catalog against the control plane's."""

    reported: bool
    degraded: bool = False
    lacking: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    types: frozenset[str] = field(default_factory=frozenset)
    error: str | None = None

    # The same types, defined otherwise (a plugin or custom node of another version): said, not degraded.
    differs: bool = False

    def to_api(self) -> dict[str, Any]:
        if not self.reported:
            return {"state": "not_reported", "degraded": False, "lacking": [], "extra": [],
                    "warning": "the worker reported no node catalog"
                               + (f": {self.error}" if self.error else "")
                               + "; `any` skips it and runs targeted at it are sent unchecked"}
        warning = None
        if self.differs and not self.degraded:
            warning = ("the worker has the same node types, but some are defined otherwise (its node catalog's "
                       "hash differs): a plugin or custom node of another version?")
        return {"state": "degraded" if self.degraded else "ok", "degraded": self.degraded,
                "lacking": list(self.lacking), "extra": list(self.extra), "warning": warning}


def compare(own: Mapping[str, Any], worker: Mapping[str, Any] | None, error: str | None = None) -> CatalogState:
    """The worker's catalog (None: not reported) against ``own``, the control plane's.

    Degraded means it lacks types or has extra ones, so a degraded worker can always say which; a hash
    that differs with the same types is only a warning."""
    if worker is None:
        return CatalogState(False, error=error)
    mine, theirs = set(own["types"]), set(worker["types"])
    lacking, extra = tuple(sorted(mine - theirs)), tuple(sorted(theirs - mine))
    return CatalogState(True, bool(lacking or extra), lacking, extra, frozenset(theirs),
                        differs=own["hash"] != worker["hash"])


def any_refusal(name: str, state: CatalogState | None) -> str | None:
    """Why ``any`` skips this worker, or None: it lacks types, or reported no catalog."""
    if state is None:
        return None
    if not state.reported:
        return f"worker {name} reported no node catalog (`any` skips it)"
    if state.lacking:
        return f"worker {name} is degraded: it lacks {', '.join(state.lacking[:10])}"
    return None


def any_skips(executors: Mapping[str, Any]) -> dict[str, str]:
    """The executors ``any`` leaves out for their catalog, with the reason; only remote
    workers carry one (``catalog``), so the control plane itself is never left out."""
    out = {}
    for name in sorted(executors):
        why = any_refusal(name, getattr(executors[name], "catalog", None))
        if why:
            out[name] = why
    return out


def graph_types(graph: Mapping[str, Any], library: Mapping[str, Mapping[str, Any]],
                preset_params: PresetParams) -> set[str]:
    """Every node type a graph runs: its own nodes', and those of every preset or
    subgraph it uses, embedded or installed, including the presets Map nodes run
    (``preset_params``: the registry's, which says which params run a preset)."""
    presets = {str(p.get("preset_name") or p.get("name")): p for p in graph.get("presets") or []
               if isinstance(p, dict)}
    lib = {**library, **presets}
    bodies: list[Any] = [graph.get("nodes")]
    bodies += [lib[n].get("nodes") for n in presets_used(graph, lib, preset_params) if n in lib]
    types: set[str] = set()
    for nodes in bodies:
        for node in nodes if isinstance(nodes, list) else []:
            t = node.get("type") if isinstance(node, dict) else None
            if isinstance(t, str) and t and not t.startswith(PRESET_PREFIX):
                types.add(t)
    return types


def missing_types(state: CatalogState | None, graph: Mapping[str, Any],
                  library: Mapping[str, Mapping[str, Any]], preset_params: PresetParams) -> list[str]:
    """Types the graph uses that the worker lacks; [] when it has them all, or reported no
    catalog (such a worker's runs go unchecked) or has one equal to the control plane's."""
    if state is None or not state.reported or not state.degraded:
        return []
    return sorted(graph_types(graph, library, preset_params) - state.types)


def missing_message(name: str, missing: list[str]) -> str:
    return (f"worker {name} lacks node type(s) the graph uses: {', '.join(missing)} "
            f"(it is degraded: its node catalog differs from the control plane's)")


def refuse_missing(name: str, missing: list[str]) -> CduiError:
    pack_ids = sorted({t.split(":", 1)[0] for t in missing if ":" in t})
    install = (f"install the pack(s) on {name} with `cdui plugin install {' '.join(pack_ids)}` and restart its "
               f"agent (see docs/plugins.md), or target another worker") if pack_ids else (
        f"install the same plugins and custom nodes on {name} and restart its agent, or target "
        f"another worker (see docs/workers-in-sync.md)")
    return CduiError("missing_node_types", missing_message(name, missing), hint=install, status=400,
                     details={"missing": missing, **({"install": [f"cdui plugin install {p}" for p in pack_ids]}
                                                     if pack_ids else {})})
