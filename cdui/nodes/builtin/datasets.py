"""Dataset nodes: TensorDataset, DataLoader and ImageFolderDataset.

``TensorDataset`` is a cdui addition (CodefyUI has no node that turns a
feature tensor and a label list into a DATASET): it is what lets a CSV feed a
DataLoader and a TrainingLoop. String labels become class indices in sorted
order -- the same order KNN's ``classes`` uses -- and its ``classes`` output
can be wired into a second TensorDataset (the validation split) so both use
one mapping.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, DATALOADER, DATASET, LIST, TENSOR, TRANSFORM, Node, Param, Port
from cdui.nodes.builtin._util import as_bool, as_tensor

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext


def encode_labels(labels: Any, classes: list | None, dtype: str) -> tuple[Any, list]:
    """Targets tensor + class names for ``labels`` (list or tensor)."""
    import torch

    if isinstance(labels, torch.Tensor):
        if dtype == "float" or (dtype == "auto" and labels.is_floating_point()):
            return labels.float(), []
        return labels.long(), []
    values = list(labels)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric and not classes:
        if dtype == "float" or (dtype == "auto" and any(isinstance(v, float) for v in values)):
            return torch.tensor(values, dtype=torch.float32), []
        return torch.tensor([int(v) for v in values], dtype=torch.long), []
    names = [str(c) for c in classes] if classes else sorted({str(v) for v in values})
    index_of = {c: i for i, c in enumerate(names)}
    unknown = sorted({str(v) for v in values} - set(index_of))
    if unknown:
        raise ValueError(f"TensorDataset: labels {unknown[:5]} are not in the wired classes {names}; "
                         f"wire the classes of the dataset built from all labels")
    targets = torch.tensor([index_of[str(v)] for v in values], dtype=torch.long)
    return (targets.float() if dtype == "float" else targets), names


class TensorDatasetNode(Node):
    NODE_NAME = "TensorDataset"
    CATEGORY = "Data"
    DESCRIPTION = ("Pair a feature tensor with its labels as a DATASET for DataLoader. "
                   "String labels become class indices in sorted order.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("features", TENSOR, "Feature tensor [N, ...]."),
            Port("labels", ANY, "Labels: a list (strings or numbers) or a tensor of length N."),
            Port("classes", LIST, "Class names to index labels by (wire the training "
                 "dataset's classes into the validation one).", optional=True),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("dataset", DATASET, "Dataset of (features[i], target[i]) pairs"),
            Port("classes", LIST, "Class names in index order (empty for numeric labels)"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("label_dtype", "select", "auto",
                      "Targets as class indices (long, for CrossEntropyLoss) or floats (for "
                      "regression losses); auto picks long for labels that are classes.",
                      options=["auto", "long", "float"])]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        from torch.utils.data import TensorDataset

        features = as_tensor(inputs.get("features"), "features")
        if not features.is_floating_point():
            features = features.float()
        if inputs.get("labels") is None:
            raise ValueError("TensorDataset requires a `labels` input")
        targets, classes = encode_labels(inputs["labels"], inputs.get("classes"),
                                         str(params.get("label_dtype") or "auto"))
        if targets.shape[0] != features.shape[0]:
            raise ValueError(f"TensorDataset: {features.shape[0]} feature rows but "
                             f"{targets.shape[0]} labels")
        return {"dataset": TensorDataset(features.detach(), targets), "classes": classes}


class DataLoaderNode(Node):
    NODE_NAME = "DataLoader"
    CATEGORY = "Data"
    DESCRIPTION = "Split a dataset into batches for training"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("dataset", DATASET, "Dataset to wrap")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("dataloader", DATALOADER, "DataLoader for batched iteration")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("batch_size", "int", 32, "Samples per batch", min_value=1),
            Param("shuffle", "bool", True, "Shuffle data at every epoch"),
            Param("num_workers", "int", 0, "Subprocesses for data loading", min_value=0),
            Param("pin_memory", "bool", False,
                  "Stage batches in page-locked memory for faster GPU transfer (no effect on CPU)"),
            Param("drop_last", "bool", False, "Discard the final short batch so every batch has the same size",
                  advanced=True),
            Param("persistent_workers", "bool", False,
                  "Keep worker processes alive between epochs. Requires num_workers > 0.", advanced=True),
            Param("prefetch_factor", "int", 2, "Batches each worker loads ahead. Ignored when num_workers is 0.",
                  min_value=1, advanced=True),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        dataset = inputs.get("dataset")
        if dataset is None:
            raise ValueError("DataLoader requires a `dataset` input")
        workers = int(params.get("num_workers", 0) or 0)
        kwargs: dict[str, Any] = {
            "batch_size": int(params.get("batch_size", 32)),
            "shuffle": as_bool(params.get("shuffle"), True),
            "num_workers": workers,
            "pin_memory": as_bool(params.get("pin_memory"), False),
            "drop_last": as_bool(params.get("drop_last"), False),
        }
        # torch rejects these two without workers; with none there is nothing
        # to configure, so they are dropped -- except an explicit request to
        # keep workers alive, which is a real misconfiguration.
        if workers > 0:
            kwargs["persistent_workers"] = as_bool(params.get("persistent_workers"), False)
            kwargs["prefetch_factor"] = int(params.get("prefetch_factor") or 2)
        elif as_bool(params.get("persistent_workers"), False):
            raise ValueError("persistent_workers requires num_workers > 0; set num_workers "
                             "or turn persistent_workers off")
        return {"dataloader": DataLoader(dataset, **kwargs)}


def _dataset_root(ctx: RunContext, value: str) -> Any:
    """CodefyUI resolves a relative dataset path against the data folder; a
    path that only exists relative to the installation is accepted too."""
    v = value.replace("\\", "/")
    if v.startswith("data/") or v == "data" or v.startswith("/"):  # absolute: under CODEFYUI_READ_ROOTS
        return ctx.resolve(v)
    in_data = ctx.resolve("data/" + v)
    if in_data.exists():
        return in_data
    in_install = ctx.resolve(v)
    return in_install if in_install.exists() else in_data


class ImageFolderDatasetNode(Node):
    NODE_NAME = "ImageFolderDataset"
    CATEGORY = "Data"
    DESCRIPTION = ("Load your own images from one folder per class. Labels come from "
                   "the folder names, sorted alphabetically.")

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("train_transform", TRANSFORM, "Pipeline for the training split. Ignored unless "
                 "split is 'train'.", optional=True),
            Port("eval_transform", TRANSFORM, "Pipeline for any other split, and the fallback for "
                 "the training split when train_transform is unwired.", optional=True),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("dataset", DATASET, "Dataset of (image tensor, class index)"),
            Port("classes", LIST, "Class names in label order, so label 0 is classes[0]"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("path", "folder", "", "Directory holding the splits. Relative paths resolve "
                  "against the data folder."),
            Param("split", "select", "train", "Sub-directory of path to load. Pick '(none)' when the "
                  "class folders sit directly under path.", options=["train", "val", "test", "(none)"]),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        from cdui.nodes.builtin._torchlib.images import ImageFolder

        raw = str(params.get("path") or "").strip()
        if not raw:
            raise ValueError("ImageFolderDataset needs a path: the directory that holds your "
                             "class folders (or the splits containing them)")
        split = str(params.get("split") or "train")
        base = _dataset_root(ctx, raw)
        root = base if split == "(none)" else base / split
        if not root.is_dir():
            if not base.is_dir():
                raise ValueError(f"ImageFolderDataset: {raw!r} is not a directory (looked at {base})")
            present = sorted(p.name for p in base.iterdir() if p.is_dir())
            raise ValueError(f"ImageFolderDataset: {raw!r} has no {split!r} sub-directory; it "
                             f"contains {present[:10]}. If those are your classes, set split to '(none)'")
        if not any(p.is_dir() for p in root.iterdir()):
            raise ValueError(f"ImageFolderDataset: {root} has no sub-directories, so there are no "
                             f"classes; put each class's images in a folder named after it")
        transform = inputs.get("eval_transform")
        if split == "train" and inputs.get("train_transform") is not None:
            transform = inputs["train_transform"]
        dataset = ImageFolder(root, transform=transform)
        ctx.log(f"ImageFolderDataset: {len(dataset)} images in {len(dataset.classes)} classes")
        return {"dataset": dataset, "classes": list(dataset.classes)}
