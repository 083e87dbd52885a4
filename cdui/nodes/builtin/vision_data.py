"""CodefyUI's ``Dataset`` (MNIST, FashionMNIST, CIFAR10 from the data folder,
never downloaded) and ``DatasetBatch`` (a stacked slice of any dataset).

The files live on the machine that runs the graph, under its data folder
(``./data``, CodefyUI's default, is that folder); see cdui.nodes.offline_datasets for
the layouts and ``cdui datasets import`` for putting them there. A graph whose
dataset is missing is refused before any node runs (``preflight``), naming the
files and the command.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdui.core.errors import CduiError
from cdui.core.paths import safe_join
from cdui.nodes.base import DATASET, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, I, T, int_param
from cdui.nodes.offline_datasets import DATASETS_FOLDER, NAMES, DatasetMissing, load, missing_message, spec

if TYPE_CHECKING:  # pragma: no cover
    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext


def data_root(layout: Layout, value: Any) -> Path:
    """The folder a ``data_dir`` param names: ``./data`` (the default) is the
    machine's data folder, also for a worker's run whose own data folder is a
    per-run one (its layout names the machine's as ``datasets``); other
    relative paths follow the usual path rules."""
    v = str(value or "./data").strip().replace("\\", "/").removeprefix("./").rstrip("/") or "data"
    machine = layout.folders.get(DATASETS_FOLDER)
    if machine is not None and (v == "data" or v.startswith("data/")):
        return layout.check_not_private(safe_join(machine, v[5:], allow_empty=True), str(value))
    return layout.resolve(v)


class DatasetNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Dataset", "Data"
    DESCRIPTION = "MNIST, FashionMNIST or CIFAR10 from the data folder, pixels scaled to [-1, 1]"
    OUTPUTS = (Port("dataset", DATASET, "(image (C, H, W), label) pairs"),)
    PARAMS = (Param("name", "select", "MNIST", "Which dataset", options=list(NAMES)),
              Param("split", "select", "train", "Training or test images", options=["train", "test"]),
              Param("data_dir", "string", "./data", "Folder holding the dataset's files (./data: the data folder)"))

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        name, split = str(params.get("name") or "MNIST"), str(params.get("split") or "train")
        if name not in NAMES or split not in ("train", "test"):
            return []  # the param check reports it
        try:
            root = data_root(layout, params.get("data_dir"))
        except CduiError as exc:
            return [("bad_param", f"data_dir: {exc.message}")]
        problem = missing_message(root, name, split)
        return [("missing_dataset", problem)] if problem else []

    @classmethod
    def reads_outside(cls, params: dict[str, Any], layout: Layout) -> list[Path]:
        """The dataset's own folder (MNIST/, cifar-10-batches-py/), not the whole data folder."""
        name = str(params.get("name") or "MNIST")
        if name not in NAMES:
            return []
        return [data_root(layout, params.get("data_dir")) / spec(name).folder]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        name, split = str(params.get("name") or "MNIST"), str(params.get("split") or "train")
        try:
            dataset = load(data_root(ctx.layout, params.get("data_dir")), name, split)
        except DatasetMissing as exc:
            raise ValueError(str(exc)) from None
        ctx.log(f"Dataset: {dataset!r}")
        return {"dataset": dataset}


class DatasetBatchNode(DeclaredNode):
    NODE_NAME, CATEGORY = "DatasetBatch", "Data"
    DESCRIPTION = "Stack batch_size consecutive samples of a dataset (wrapping around) into tensors"
    INPUTS = (Port("dataset", DATASET, "Any indexable dataset of (input, label) pairs"),)
    OUTPUTS = (T("images", "Stacked inputs (B, ...)"), T("labels", "Labels (B,) as class ids, or stacked masks"))
    PARAMS = (I("batch_size", 1, "Samples to take", lo=1), I("start_index", 0, "First sample", lo=0))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        dataset = inputs.get("dataset")
        if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ValueError("DatasetBatch: the dataset input is not an indexable dataset")
        n = len(dataset)
        if n == 0:
            raise ValueError("DatasetBatch: the dataset is empty")
        size, start = int_param(params, "batch_size", 1), int_param(params, "start_index", 0)
        items = [dataset[(start + i) % n] for i in range(size)]
        images = torch.stack([torch.as_tensor(x) for x, _ in items])
        labels = [y for _, y in items]
        if all(isinstance(y, torch.Tensor) and y.dim() > 0 for y in labels):
            return {"images": images, "labels": torch.stack(labels)}
        return {"images": images, "labels": torch.tensor([int(y) for y in labels], dtype=torch.long)}
