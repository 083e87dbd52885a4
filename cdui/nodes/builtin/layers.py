"""Layer nodes: Linear, Activation, Flatten (tensor in, tensor out) and
SequentialModel (a whole model, from the layer graph in its ``layers`` param).

Linear builds a fresh ``nn.Linear`` on every execution: a run executes each
node once, so there is no cross-run weight state to keep (CodefyUI's optional
"persist weights between runs" setting has no cdui counterpart).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import MODEL, TENSOR, Node, Param, Port
from cdui.nodes.builtin._util import as_tensor

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from cdui.graph.context import RunContext

ACTIVATIONS = ["relu", "sigmoid", "tanh", "leaky_relu", "elu", "gelu", "silu", "mish",
               "selu", "softmax", "hardswish", "prelu"]


class LinearNode(Node):
    NODE_NAME = "Linear"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    CATEGORY = "Utility"
    DESCRIPTION = "Fully-connected (dense) layer: y = xW^T + b. Wraps nn.Linear(in_features, out_features)."

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Input tensor (..., in_features)")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Output tensor (..., out_features)")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("in_features", "int", 512, "Input feature size"),
            Param("out_features", "int", 10, "Output feature size"),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        x = as_tensor(inputs.get("tensor"), "tensor")
        in_f, out_f = int(params.get("in_features", 512)), int(params.get("out_features", 10))
        if x.shape[-1] != in_f:
            raise ValueError(f"Linear: input's last dimension is {x.shape[-1]} but in_features={in_f}; "
                             f"set in_features to {x.shape[-1]}")
        layer = nn.Linear(in_f, out_f).to(x.device)
        return {"tensor": layer(x.float() if not x.is_floating_point() else x)}


class ActivationNode(Node):
    NODE_NAME = "Activation"
    CATEGORY = "CNN"
    DESCRIPTION = "Applies the selected nonlinearity; shape unchanged"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Input tensor")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Activated output tensor")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("function", "select", "relu", "Activation function to apply", options=ACTIVATIONS)]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        x = as_tensor(inputs.get("tensor"), "tensor")
        fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
            "leaky_relu": lambda t: F.leaky_relu(t, negative_slope=0.01), "elu": F.elu,
            "gelu": F.gelu, "silu": F.silu, "mish": F.mish, "selu": F.selu,
            "softmax": lambda t: F.softmax(t, dim=-1), "hardswish": F.hardswish,
            # CodefyUI: a fresh, untrained PReLU (slope 0.25) on every run.
            "prelu": lambda t: nn.PReLU().to(t.device)(t),
        }
        name = str(params.get("function") or "relu")
        if name not in fns:
            raise ValueError(f"Activation: unsupported function {name!r}; use one of {ACTIVATIONS}")
        return {"tensor": fns[name](x)}


class FlattenNode(Node):
    NODE_NAME = "Flatten"
    CATEGORY = "Utility"
    DESCRIPTION = "Flatten a tensor's dimensions from start_dim onward"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Input tensor")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Flattened tensor")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("start_dim", "int", 1, "First dim to flatten")]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        x = as_tensor(inputs.get("tensor"), "tensor")
        return {"tensor": x.flatten(start_dim=int(params.get("start_dim", 1)))}


# The architecture CodefyUI's SequentialModel starts from: an MNIST CNN.
DEFAULT_LAYERS = (
    '{"version":2,"nodes":['
    '{"id":"in","type":"Input","ports":[{"id":"p_x","name":"x"}]},'
    '{"id":"c1","type":"Conv2d","params":{"in_channels":1,"out_channels":32,"kernel_size":3,"padding":1}},'
    '{"id":"r1","type":"ReLU"},'
    '{"id":"p1","type":"MaxPool2d","params":{"kernel_size":2,"stride":2}},'
    '{"id":"c2","type":"Conv2d","params":{"in_channels":32,"out_channels":64,"kernel_size":3,"padding":1}},'
    '{"id":"r2","type":"ReLU"},'
    '{"id":"p2","type":"MaxPool2d","params":{"kernel_size":2,"stride":2}},'
    '{"id":"f","type":"Flatten"},'
    '{"id":"l1","type":"Linear","params":{"in_features":3136,"out_features":128}},'
    '{"id":"r3","type":"ReLU"},'
    '{"id":"l2","type":"Linear","params":{"in_features":128,"out_features":10}},'
    '{"id":"out","type":"Output","ports":[{"id":"p_y","name":"y"}]}'
    '],"edges":['
    '{"id":"e1","source":"in","sourceHandle":"p_x","target":"c1"},'
    '{"id":"e2","source":"c1","target":"r1"},{"id":"e3","source":"r1","target":"p1"},'
    '{"id":"e4","source":"p1","target":"c2"},{"id":"e5","source":"c2","target":"r2"},'
    '{"id":"e6","source":"r2","target":"p2"},{"id":"e7","source":"p2","target":"f"},'
    '{"id":"e8","source":"f","target":"l1"},{"id":"e9","source":"l1","target":"r3"},'
    '{"id":"e10","source":"r3","target":"l2"},'
    '{"id":"e11","source":"l2","target":"out","targetHandle":"p_y"}]}'
)


class SequentialModelNode(Node):
    NODE_NAME = "SequentialModel"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    CATEGORY = "Training"
    DESCRIPTION = ("Build a model from a layer graph (the `layers` param). Outputs a MODEL "
                   "that can be connected to Optimizer and TrainingLoop.")

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("model", MODEL, "Built model")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("layers", "string", DEFAULT_LAYERS,
                      "Layer graph JSON (v2: {version, nodes, edges}) or a list of layers (v1).")]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        from cdui.nodes.builtin._torchlib.layer_spec import build_model

        model = build_model(params.get("layers", DEFAULT_LAYERS))
        total = sum(p.numel() for p in model.parameters())
        layers = getattr(model, "layers", list(model.children()))
        ctx.log(f"Fresh initialisation ({total:,} parameters across {len(layers)} layers).")
        return {"model": model}
