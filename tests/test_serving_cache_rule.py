"""Which nodes an app's serving process may answer from its cache (cdui/run/canvas_proc.py ``_serving_cacheable``,
docs/apps.md): what a canvas Run may, and the nodes whose only outputs are models; never a training step, an
optimizer, a writer or a node that draws at random."""
from __future__ import annotations

from cdui.nodes.registry import build_registry
from cdui.run.canvas_proc import _serving_cacheable


def test_model_builders_and_loaders_are_kept_in_an_app_and_training_is_not() -> None:
    reg = build_registry()
    got = {name: _serving_cacheable(reg.get(name)) for name in (
        "SequentialModel", "ModelLoader", "Inference", "CSVReader",
        "TrainingLoop", "Optimizer", "CheckpointLoader", "ModelSaver", "BackwardOnce")}
    assert got == {"SequentialModel": True, "ModelLoader": True, "Inference": False, "CSVReader": True,
                   "TrainingLoop": False, "Optimizer": False, "CheckpointLoader": False, "ModelSaver": False,
                   "BackwardOnce": False}
