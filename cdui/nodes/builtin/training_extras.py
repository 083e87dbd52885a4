"""CodefyUI's LRScheduler and EvaluateModel: a learning-rate schedule built on
an optimizer, and the accuracy of a classifier over a whole dataset."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, DATASET, MODEL, OPTIMIZER, SCALAR, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, F, I, float_param, int_param
from cdui.nodes.builtin._util import resolve_device

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

SCHEDULERS = ["StepLR", "CosineAnnealingLR", "ExponentialLR", "ReduceLROnPlateau", "CosineAnnealingWarmRestarts",
              "MultiStepLR", "OneCycleLR"]


class LRSchedulerNode(DeclaredNode):
    NODE_NAME, CATEGORY = "LRScheduler", "Training"
    CACHEABLE = False  # a live object training changes in place
    DESCRIPTION = "A torch learning-rate scheduler on the optimizer"
    INPUTS = (Port("optimizer", OPTIMIZER, "The optimizer whose learning rate it steers"),)
    OUTPUTS = (Port("scheduler", ANY, "The torch.optim.lr_scheduler object"),)
    PARAMS = (Param("type", "select", "StepLR", "Which schedule", options=SCHEDULERS),
              I("step_size", 10, "StepLR period; MultiStepLR milestones are 1-4 times it"),
              F("gamma", 0.1, "Decay factor"), I("T_max", 50, "Cosine period (T_0 of the warm-restart variant)"),
              F("max_lr", 0.01, "OneCycleLR peak"), I("total_steps", 1000, "OneCycleLR length"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.optim as optim
        from torch.optim import lr_scheduler as sched

        opt = inputs.get("optimizer")
        if not isinstance(opt, optim.Optimizer):
            raise ValueError("LRScheduler: the optimizer input must be an optimizer (from an Optimizer node)")
        kind = str(params.get("type") or "StepLR")
        step, gamma = max(1, int_param(params, "step_size", 10)), float_param(params, "gamma", 0.1)
        t_max = max(1, int_param(params, "T_max", 50))
        builders: dict[str, Any] = {
            "StepLR": lambda: sched.StepLR(opt, step_size=step, gamma=gamma),
            "CosineAnnealingLR": lambda: sched.CosineAnnealingLR(opt, T_max=t_max),
            "ExponentialLR": lambda: sched.ExponentialLR(opt, gamma=gamma),
            "ReduceLROnPlateau": lambda: sched.ReduceLROnPlateau(opt, factor=gamma),
            "CosineAnnealingWarmRestarts": lambda: sched.CosineAnnealingWarmRestarts(opt, T_0=t_max),
            "MultiStepLR": lambda: sched.MultiStepLR(opt, milestones=[step * k for k in (1, 2, 3, 4)], gamma=gamma),
            "OneCycleLR": lambda: sched.OneCycleLR(opt, max_lr=float_param(params, "max_lr", 0.01),
                                                   total_steps=max(1, int_param(params, "total_steps", 1000))),
        }
        if kind not in builders:
            raise ValueError(f"LRScheduler: unknown type {kind!r}")
        return {"scheduler": builders[kind]()}


class EvaluateModelNode(DeclaredNode):
    NODE_NAME, CATEGORY = "EvaluateModel", "Training"
    CACHEABLE = False  # training: changes the weights it is given, emits metrics
    DESCRIPTION = "Accuracy of a classifier over a whole dataset (argmax over dim 1 against the labels)"
    INPUTS = (Port("model", MODEL, "The classifier"), Port("dataset", DATASET, "(input, label) pairs"))
    OUTPUTS = (Port("accuracy", SCALAR, "correct / total"), Port("correct", SCALAR, "Right answers"),
               Port("total", SCALAR, "Labels compared"))
    PARAMS = (I("batch_size", 256, "Items per forward pass", lo=1),
              # "auto" (the run's device) is not in CodefyUI 1.4.2's options, but graphs exported
              # from later CodefyUI versions set it (tests/data/codefyui_examples/TrainCNN-MNIST).
              Param("device", "select", "cpu", "Where to evaluate ('auto': the run's device)",
                    options=["cpu", "cuda", "auto"]))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch
        from torch.utils.data import DataLoader

        model, dataset = inputs.get("model"), inputs.get("dataset")
        if not isinstance(model, torch.nn.Module):
            raise ValueError("EvaluateModel: the model input must be a torch model")
        if dataset is None:
            raise ValueError("EvaluateModel: the dataset input is required")
        device = str(params.get("device") or "cpu")
        if device == "auto":
            device = resolve_device("auto", ctx)
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("EvaluateModel: device is cuda but this machine has no CUDA device; choose cpu")
        batch = min(max(1, int_param(params, "batch_size", 256)), 65536)
        was_training = model.training
        model = model.to(device)
        model.eval()
        correct = total = 0
        try:
            with torch.no_grad():
                for item in DataLoader(dataset, batch_size=batch, shuffle=False):
                    ctx.check_stop()
                    x, y = item[0].to(device), torch.as_tensor(item[1]).to(device)
                    pred = model(x).argmax(dim=1)
                    correct += int((pred == y).sum().item())
                    total += int(y.numel())
        finally:
            # The caller's model goes back to the mode it came in.
            model.train(was_training)
        return {"accuracy": correct / total if total else 0.0, "correct": float(correct), "total": float(total)}
