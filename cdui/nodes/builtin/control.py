"""Start and Print: the entry point of a graph and its simplest output.

``Start`` does no work and passes no data. Its ``trigger`` output is wired
with edges of ``type: "trigger"`` (no ``targetHandle``) to the data roots that
should run; the executor uses those edges to decide which part of the graph
is live, never to pass values.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, TRIGGER, Node, Param, Port
from cdui.nodes.builtin._util import summarize

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext


class StartNode(Node):
    NODE_NAME = "Start"
    CATEGORY = "Control"
    DESCRIPTION = "Entry point; the node its trigger reaches runs first"

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("trigger", TRIGGER, "Execution trigger marker (carries no data)")]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        return {}


def format_value(value: Any) -> str:
    """What Print shows: small tensors in full, large ones as shape + dtype."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return str(value)
    if isinstance(value, torch.Tensor) and value.numel() > 1000:
        s = summarize(value)
        return f"tensor(shape={s['shape']}, dtype={s['dtype']})"
    return str(value)


class PrintNode(Node):
    NODE_NAME = "Print"
    CACHEABLE = False  # its point is a side effect
    CATEGORY = "Utility"
    DESCRIPTION = "Print a value to the run log and pass it through"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("value", ANY, "Any value to print")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("value", ANY, "Pass-through")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("label", "string", "", "Label prefix")]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        value = inputs.get("value")
        label = str(params.get("label") or "")
        text = f"[{label}] {format_value(value)}" if label else format_value(value)
        # The run log is where a Print is read; the value itself is passed on
        # untouched so Print can sit in the middle of a chain.
        ctx.log(text)
        return {"value": value}
