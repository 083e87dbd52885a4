"""TrainingLoop ``strategy: ddp`` on the CPU: two real gloo processes on loopback,
against the same training in one process."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.nodes.builtin import datasets, layers, training
from cdui.nodes.builtin.training_loop import TrainingLoopNode
from test_nodes import MLP, iris_split, run


def _train(tmp_path: Path, **loop: Any) -> dict[str, Any]:
    ctx = RunContext("ddp", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)
    torch.manual_seed(0)
    split = iris_split(ctx)
    ds = run(datasets.TensorDatasetNode, ctx, {"features": split["x_train"], "labels": split["y_train"]})
    # 120 rows in batches of 16: the two ranks take 8 each of every batch one process takes.
    loader = run(datasets.DataLoaderNode, ctx, {"dataset": ds["dataset"]}, batch_size=16, shuffle=False)
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    inputs = {"model": model, "dataloader": loader["dataloader"],
              "optimizer": run(training.OptimizerNode, ctx, {"model": model}, lr=0.01)["optimizer"],
              "loss_fn": run(training.LossNode, ctx)["loss_fn"]}
    out = run(TrainingLoopNode, ctx, inputs, device="cpu", epochs=2, **loop)
    assert out["model"] is model, "the node's model output is the model it was given, trained"
    return out


def test_ddp_two_cpu_processes_match_one_process(tmp_path: Path) -> None:
    single = _train(tmp_path / "single")
    ddp = _train(tmp_path / "ddp", strategy="ddp", ddp_processes=2)
    assert ddp["metrics"]["strategy"] == "ddp" and ddp["metrics"]["ddp_processes"] == 2
    assert single["metrics"]["strategy"] == "single"
    # The same batches, the gradients averaged: the same curve, up to float rounding.
    assert ddp["losses"].tolist() == pytest.approx(single["losses"].tolist(), rel=1e-4)
    assert ddp["metrics"]["optimizer_steps"] == single["metrics"]["optimizer_steps"] == 16


def test_ddp_refuses_more_processes_than_allowed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ddp_processes=65 is out of range"):
        _train(tmp_path, strategy="ddp", ddp_processes=65)
