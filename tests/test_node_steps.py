"""Node steps (``__steps__``), per-node modules, CodefyUI's node API and the pack safety check, in
this process through the real registry, validator and executor (tests/test_plugins.py runs packs
end to end in real processes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.graph.executor import Executor
from cdui.graph.validate import validate_graph
from cdui.nodes import codefyui_compat, packs
from cdui.nodes.base import Node, Param, Port, StepRecorder
from cdui.nodes.registry import Registry, build_registry


class Doubler(Node):
    """cdui's own node API: steps while recording, a module kept per graph node for the run."""
    NODE_NAME = "Doubler"
    STRUCTURAL_PARAMS = ("width",)
    built: list[int] = []

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("value", "SCALAR")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("width", "int", 2), Param("x", "float", 1.0)]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        module = self.stateful_module(ctx, params, lambda: Doubler.built.append(params["width"]) or object())
        out: dict[str, Any] = {"value": params["x"] * 2, "module": id(module)}
        if ctx.verbose:
            rec = StepRecorder()
            rec.record("double", "x times two", scalars={"x": params["x"]}, doubled=params["x"] * 2)
            out["__steps__"] = rec.steps
        return out


@pytest.fixture
def registry() -> Registry:
    reg = build_registry()
    reg.register(Doubler)
    return reg


def run(reg: Registry, tmp_path: Path, recording: bool) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]],
                                                                  dict[str, dict[str, Any]]]:
    graph = {"nodes": [{"id": "s", "type": "Start"}, {"id": "d", "type": "Doubler", "data": {"params": {"x": 3.0}}}],
             "edges": [{"id": "t", "source": "s", "target": "d", "sourceHandle": "trigger", "type": "trigger"}]}
    layout = Layout.for_data_dir(tmp_path)
    plan, errors = validate_graph(graph, reg, layout=layout)
    assert errors == [] and plan is not None
    events: list[tuple[str, dict[str, Any]]] = []
    recorded: dict[str, dict[str, Any]] = {}
    on_outputs = (lambda nid, _t, result: recorded.__setitem__(nid, result)) if recording else None
    ctx = RunContext("r", layout, emit=lambda kind, data: events.append((kind, data)))
    out = Executor(reg, ctx, on_outputs).run(plan)
    return out, events, recorded


def test_steps_reported_and_recorded_only_while_recording(registry: Registry, tmp_path: Path) -> None:
    out, events, recorded = run(registry, tmp_path, recording=True)
    assert "__steps__" not in out["d"], "steps never reach a port"
    steps = [d for k, d in events if k == "node_steps"]
    assert steps == [{"node_id": "d", "type": "Doubler", "steps": [
        {"name": "double", "description": "x times two", "scalars": {"x": 3.0}, "values": {"doubled": 6.0}}]}]
    assert recorded["d"]["__step__0__meta"] == "double: x times two (x=3)"
    assert recorded["d"]["__step__0__doubled"] == 6.0 and recorded["d"]["value"] == 6.0
    out, events, recorded = run(registry, tmp_path, recording=False)
    assert out["d"]["value"] == 6.0 and not [k for k, _ in events if k == "node_steps"] and recorded == {}


def test_stateful_module_is_kept_per_node_and_structure(tmp_path: Path) -> None:
    ctx = RunContext("r", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)
    Doubler.built = []
    node = Doubler()
    ctx.node_id = "a"
    first = node.stateful_module(ctx, {"width": 2, "x": 1.0}, lambda: object())
    assert node.stateful_module(ctx, {"width": 2, "x": 5.0}, lambda: object()) is first, "x is not structural"
    assert node.stateful_module(ctx, {"width": 3, "x": 1.0}, lambda: object()) is not first
    ctx.node_id = "b"
    assert node.stateful_module(ctx, {"width": 3, "x": 1.0}, lambda: object()) is not first


def test_codefyui_node_without_context_or_progress_runs(tmp_path: Path) -> None:
    """An older CodefyUI node whose execute takes (inputs, params) only."""
    codefyui_compat.install_modules()
    from app.core.node_base import BaseNode, DataType, ParamDefinition, ParamType, PortDefinition

    class Old(BaseNode):
        NODE_NAME = "Old"

        @classmethod
        def define_inputs(cls):
            return []

        @classmethod
        def define_outputs(cls):
            return [PortDefinition("out", DataType.SCALAR)]

        @classmethod
        def define_params(cls):
            return [ParamDefinition("k", ParamType.INT, 4, min_value=1, visible_when={"m": ["a", "b"]})]

        def execute(self, inputs, params):
            return {"out": params["k"] + 1}

    cls = codefyui_compat.adapt(Old, "pk:Old", "pk")
    assert cls.describe()["params"] == [{"name": "k", "type": "int", "default": 4, "description": "", "min": 1,
                                         "visible_when": {"m": ["a", "b"]}}]
    ctx = RunContext("r", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)
    assert cls().execute({}, {"k": 4}, ctx) == {"out": 5}


@pytest.mark.parametrize(("source", "problem"), [
    ("import torch\nm = torch.load('w.pt')\n", "torch.load without weights_only=True"),
    ("from os import path\n", "needs the 'process-env' capability"),
    ("from os.path import exists\n", "needs the 'process-env' capability"),
    ("import torch\nm = torch.hub.load('a', 'b')\n", "attribute 'hub'"),
    ("getattr(object, '__subclasses__')()\n", "reaches the interpreter's internals"),
    ("import importlib.util\n", "can run code"),
])
def test_scan_refuses(source: str, problem: str) -> None:
    found = packs.scan_source(source, "n.py")
    assert any(problem in p for p in found), found


def test_scan_allows_what_the_official_packs_do() -> None:
    ok = ("from __future__ import annotations\nimport math\nfrom collections import Counter\nimport torch\n"
          "import torch.nn as nn\nimport torch.nn.functional as F\nfrom app.core.node_base import BaseNode\n"
          "from ._layer_seed import seed\nfrom os.path import join, basename\n"
          "m = torch.load('w.pt', weights_only=True)\nmodel = torch.compile(nn.Linear(2, 2))\nmodel.eval()\n"
          "class A(nn.Module):\n    def __init__(self):\n        super().__init__()\n")
    assert packs.scan_source(ok, "n.py") == []
    assert packs.scan_source("import requests\n", "n.py", capabilities=["network"]) == []
