"""An example custom node: copy this file into ``<data>/custom_nodes/`` and
restart cdui; ``HelloNode`` then appears in the node catalog.

A custom node is a subclass of :class:`cdui.nodes.base.Node` with:

- ``NODE_NAME``: the type name graphs use (``"type": "HelloNode"``);
- ``define_inputs`` / ``define_outputs``: typed ports (``Port(name, type)``);
- ``define_params``: typed params with defaults (``Param(name, type, default)``);
- ``execute(inputs, params, ctx)``: returns ``{output port name: value}``.
  ``params`` arrive merged with their defaults; ``ctx`` is the run context
  (``ctx.log``, ``ctx.metric``, ``ctx.resolve``, ``ctx.should_stop`` ...).

Import only from ``cdui.nodes.base`` so the file keeps working as cdui evolves.
"""
from __future__ import annotations

from typing import Any

from cdui.nodes.base import STRING, Node, Param, Port


class HelloNode(Node):
    NODE_NAME = "HelloNode"
    CATEGORY = "Examples"
    DESCRIPTION = "Say hello to someone"

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("value", STRING, "The greeting")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("name", "string", "world", "Who to greet")]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        greeting = f"Hello, {params.get('name') or 'world'}!"
        ctx.log(greeting)
        return {"value": greeting}
