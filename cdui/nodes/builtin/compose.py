"""Map: run a preset (a saved subgraph) once per element of a list.

Contract with the executor (``ctx.run_preset``, set by it):

    outputs = ctx.run_preset(preset_name, {FIRST_PORT: item})

``FIRST_PORT`` (the empty string) stands for the preset's first exposed input,
as in CodefyUI, where Map feeds each item to ``exposed_inputs[0]`` and
collects ``exposed_outputs[0]``. The executor returns the exposed outputs as a
dict in exposed order; Map takes the value under ``FIRST_PORT`` if the
executor echoes it, else the first value. Each call runs the whole preset, so
Map checks for a stop request before every item.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import LIST, SCALAR, Node, Param, Port

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

FIRST_PORT = ""


class MapNode(Node):
    NODE_NAME = "Map"
    CACHEABLE = False  # its point is a side effect
    CATEGORY = "Data Flow"
    DESCRIPTION = ("Apply a preset (subgraph) to each element in a list. Returns a list of "
                   "results. Functional-style batch processing.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("items", LIST, "List of items to process")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("results", LIST, "List of processed results"),
            Port("count", SCALAR, "Number of items processed"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("subgraph", "string", "", "Name of the preset/subgraph to apply to each item",
                      required=True, runs_preset=True)]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        items = inputs.get("items")
        if items is None:
            items = []
        if hasattr(items, "tolist") and not isinstance(items, (list, tuple)):
            items = list(items)  # a tensor maps over its first dimension
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"Map expects a list input, got {type(items).__name__}")
        name = str(params.get("subgraph") or "").strip()
        if not name:
            raise ValueError("Map: the subgraph parameter is required (the name of a saved preset)")
        if ctx.run_preset is None:
            # Run outside an executor (no presets at all): the name is not found, a ValueError as in CodefyUI.
            raise ValueError(f"Map: preset {name!r} was not found: this run has no presets to run")

        results: list[Any] = []
        for i, item in enumerate(items):
            ctx.check_stop()
            out = ctx.run_preset(name, {FIRST_PORT: item})
            if not out:
                raise ValueError(f"Map: preset {name!r} produced no output for item {i}")
            value = out[FIRST_PORT] if FIRST_PORT in out else next(iter(out.values()))
            results.append(value)
            ctx.progress(event="item", item=i + 1, items=len(items))
        return {"results": results, "count": float(len(results))}
