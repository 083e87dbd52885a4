"""Training building blocks: Loss, Optimizer and Inference.

(TrainingLoop has its own module, :mod:`cdui.nodes.builtin.training_loop`.)

Loss and Optimizer follow CodefyUI's rule for knobs an algorithm does not
have: left at its default, the knob is silently not passed; changed, it is an
error naming the algorithm -- a user who set ``nesterov`` under Adam has a
mental model to correct, and quietly ignoring it would teach the wrong thing.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import LOSS_FN, MODEL, OPTIMIZER, TENSOR, Node, Param, Port
from cdui.nodes.builtin._util import DEVICE_OPTIONS, as_bool, as_tensor, parse_float_sequence, resolve_device

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

LOSS_TYPES = ["CrossEntropyLoss", "MSELoss", "BCEWithLogitsLoss", "L1Loss", "SmoothL1Loss",
              "NLLLoss", "KLDivLoss", "HuberLoss", "BCELoss", "MarginRankingLoss",
              "CosineEmbeddingLoss"]
_WEIGHT_LOSSES = {"CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss"}
_IGNORE_INDEX_LOSSES = {"CrossEntropyLoss", "NLLLoss"}
DEFAULT_IGNORE_INDEX = -100

OPTIMIZER_TYPES = ["Adam", "SGD", "AdamW", "RMSprop", "Adagrad", "RAdam", "NAdam", "Rprop", "ASGD"]
_BETAS = {"Adam", "AdamW", "RAdam", "NAdam"}
# Only algorithms whose torch default eps is 1e-8 (Adagrad's is 1e-10).
_EPS = {"Adam", "AdamW", "RAdam", "NAdam", "RMSprop"}
_MOMENTUM = {"SGD", "RMSprop"}
_AMSGRAD = {"Adam", "AdamW"}
DEFAULT_BETAS = "0.9, 0.999"
DEFAULT_EPS = 1e-8


def _inapplicable(kind: str, name: str, param: str, value: Any) -> ValueError:
    return ValueError(f"{kind} '{name}' does not accept {param}; got {value!r}. "
                      f"Leave {param} at its default or pick a different {kind.lower()}.")


class LossNode(Node):
    NODE_NAME = "Loss"
    CATEGORY = "Training"
    DESCRIPTION = "Create a loss function"

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("loss_fn", LOSS_FN, "Loss function instance")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("type", "select", "CrossEntropyLoss", "Loss function type", options=list(LOSS_TYPES)),
            Param("label_smoothing", "float", 0.0,
                  "Soften the one-hot target: 0 = hard targets, 0.1 is a common regulariser",
                  min_value=0.0, max_value=1.0),
            Param("reduction", "select", "mean",
                  "How per-sample losses are combined: mean, sum, or none",
                  options=["mean", "sum", "none"], advanced=True),
            Param("weight", "string", "", "Per-class weights as a comma-separated list, e.g. '1, 5'. "
                  "Empty = every class weighted equally.", advanced=True),
            Param("ignore_index", "int", DEFAULT_IGNORE_INDEX,
                  "Target value that contributes no loss and no gradient, e.g. a padding label",
                  advanced=True),
            Param("pos_weight", "string", "", "Weight of the positive class, as one number or one "
                  "per output. Empty = unweighted.", advanced=True),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch
        import torch.nn as nn

        name = str(params.get("type") or "CrossEntropyLoss")
        if name not in LOSS_TYPES:
            raise ValueError(f"Loss: unsupported type {name!r}; use one of {LOSS_TYPES}")
        reduction = str(params.get("reduction") or "mean")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"Loss: unsupported reduction {reduction!r}; use mean, sum or none")
        kwargs: dict[str, Any] = {"reduction": reduction}

        smoothing = float(params.get("label_smoothing") or 0.0)
        if name == "CrossEntropyLoss":
            kwargs["label_smoothing"] = smoothing
        elif smoothing:
            raise _inapplicable("Loss", name, "label_smoothing", smoothing)

        weight = parse_float_sequence(params.get("weight"), "weight")
        if weight is not None:
            if name not in _WEIGHT_LOSSES:
                raise _inapplicable("Loss", name, "weight", weight)
            kwargs["weight"] = torch.tensor(weight, dtype=torch.float32)

        ignore_index = int(params.get("ignore_index", DEFAULT_IGNORE_INDEX))
        if name in _IGNORE_INDEX_LOSSES:
            kwargs["ignore_index"] = ignore_index
        elif ignore_index != DEFAULT_IGNORE_INDEX:
            raise _inapplicable("Loss", name, "ignore_index", ignore_index)

        pos_weight = parse_float_sequence(params.get("pos_weight"), "pos_weight")
        if pos_weight is not None:
            if name != "BCEWithLogitsLoss":
                raise _inapplicable("Loss", name, "pos_weight", pos_weight)
            kwargs["pos_weight"] = torch.tensor(pos_weight, dtype=torch.float32)
        return {"loss_fn": getattr(nn, name)(**kwargs)}


class OptimizerNode(Node):
    NODE_NAME = "Optimizer"
    CACHEABLE = False  # a live object training changes in place
    CATEGORY = "Training"
    DESCRIPTION = "Create an optimizer for model parameters"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("model", MODEL, "Model whose parameters to optimize")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("optimizer", OPTIMIZER, "Configured optimizer")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("type", "select", "Adam", "Optimizer algorithm", options=list(OPTIMIZER_TYPES)),
            Param("lr", "float", 0.001, "Learning rate", min_value=0.0),
            Param("weight_decay", "float", 0.0, "Weight decay (L2 penalty)", min_value=0.0),
            Param("momentum", "float", 0.0, "Momentum factor (0 = plain gradient descent)", min_value=0.0),
            Param("betas", "string", DEFAULT_BETAS, "Adam-family running-average coefficients, "
                  "as 'beta1, beta2'", advanced=True),
            Param("eps", "float", DEFAULT_EPS, "Term added to the denominator for numerical stability",
                  min_value=0.0, advanced=True),
            Param("amsgrad", "bool", False, "Use the AMSGrad variant of Adam", advanced=True),
            Param("nesterov", "bool", False, "Nesterov accelerated gradient (SGD, momentum > 0)",
                  advanced=True),
            Param("dampening", "float", 0.0, "Damping applied to the momentum term (SGD)",
                  min_value=0.0, advanced=True),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch.optim as optim

        model = inputs.get("model")
        if model is None or not hasattr(model, "parameters"):
            raise ValueError("Optimizer requires a `model` input (e.g. SequentialModel.model)")
        name = str(params.get("type") or "Adam")
        if name not in OPTIMIZER_TYPES:
            raise ValueError(f"Optimizer: unsupported type {name!r}; use one of {OPTIMIZER_TYPES}")
        cls = getattr(optim, name)
        kwargs: dict[str, Any] = {"lr": float(params.get("lr", 0.001))}

        weight_decay = float(params.get("weight_decay") or 0.0)
        if "weight_decay" in inspect.signature(cls.__init__).parameters:
            kwargs["weight_decay"] = weight_decay
        elif weight_decay:
            raise _inapplicable("Optimizer", name, "weight_decay", weight_decay)

        momentum = float(params.get("momentum") or 0.0)
        if name in _MOMENTUM:
            kwargs["momentum"] = momentum
        elif momentum:
            raise _inapplicable("Optimizer", name, "momentum", momentum)

        betas = parse_float_sequence(params.get("betas", DEFAULT_BETAS), "betas", length=2)
        if name in _BETAS:
            if betas is not None:
                kwargs["betas"] = betas
        elif betas is not None and betas != (0.9, 0.999):
            raise _inapplicable("Optimizer", name, "betas", betas)

        eps = params.get("eps", DEFAULT_EPS)
        eps = DEFAULT_EPS if eps is None else float(eps)
        if name in _EPS:
            kwargs["eps"] = eps
        elif eps != DEFAULT_EPS:
            raise _inapplicable("Optimizer", name, "eps", eps)

        amsgrad = as_bool(params.get("amsgrad"), False)
        if name in _AMSGRAD:
            kwargs["amsgrad"] = amsgrad
        elif amsgrad:
            raise _inapplicable("Optimizer", name, "amsgrad", amsgrad)

        nesterov = as_bool(params.get("nesterov"), False)
        dampening = float(params.get("dampening") or 0.0)
        if name == "SGD":
            kwargs["nesterov"], kwargs["dampening"] = nesterov, dampening
        elif nesterov:
            raise _inapplicable("Optimizer", name, "nesterov", nesterov)
        elif dampening:
            raise _inapplicable("Optimizer", name, "dampening", dampening)
        try:
            return {"optimizer": cls(model.parameters(), **kwargs)}
        except ValueError as exc:  # e.g. nesterov without momentum
            raise ValueError(f"Optimizer {name}: {exc}") from None


class InferenceNode(Node):
    NODE_NAME = "Inference"
    CACHEABLE = False  # a live object training changes in place
    CATEGORY = "IO"
    DESCRIPTION = ("Run inference (forward pass) on a trained model. Sets model to eval mode "
                   "and disables gradients.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("model", MODEL, "Trained model"),
            Port("input", TENSOR, "Input tensor"),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("output", TENSOR, "Model prediction"),
            Port("model", MODEL, "Pass-through model"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("device", "select", "auto", "Device to run on ('auto' follows the run's device)",
                      options=list(DEVICE_OPTIONS), advanced=True)]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        model = inputs.get("model")
        if model is None:
            raise ValueError("Inference requires a `model` input")
        device = resolve_device(params.get("device"), ctx)
        x = as_tensor(inputs.get("input"), "input").to(device)
        model = model.to(device)
        model.eval()
        with torch.no_grad():
            output = model(x)
        ctx.log(f"Inference: input {list(x.shape)} -> output {list(output.shape)}")
        return {"output": output, "model": model}
