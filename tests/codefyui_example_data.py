"""The files CodefyUI's example graphs read, written small into a data folder
in the layouts a real install has: MNIST as torchvision's raw IDX files,
CIFAR10 as its pickled ``cifar-10-batches-py`` batches, and the
``images/test_digit.png`` that InferenceCNN-MNIST reads (CodefyUI does not
ship it). The graphs stay as exported; only the datasets are tiny, so that
their 3-5 training epochs take a moment on a CPU.
"""
from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as functional

EXAMPLES = Path(__file__).parent / "data" / "codefyui_examples"
# Samples per split: 16 is one batch of the examples' DataLoaders (batch 64) and
# exactly the batch InferenceCNN's DatasetBatch takes (16).
SAMPLES = 16
# The 28x28 grey pixels of test_digit.png.
DIGIT_PIXELS = bytes((i * 7) % 256 for i in range(28 * 28))


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / f"{name}.graph.json").read_text(encoding="utf-8"))


def example_names() -> list[str]:
    return sorted(p.name.removesuffix(".graph.json") for p in EXAMPLES.glob("*.graph.json"))


def idx(array: torch.Tensor) -> bytes:
    """An IDX file of unsigned bytes, as MNIST's are."""
    return struct.pack(">HBB", 0, 0x08, array.dim()) + struct.pack(f">{array.dim()}I", *array.shape) + \
        bytes(array.flatten().tolist())


def write_mnist(root: Path, n: int = SAMPLES) -> None:
    gen = torch.Generator().manual_seed(0)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix in ("train", "t10k"):
        images = torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8)
        labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(idx(images))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(idx(labels))


def write_cifar10(root: Path, n: int = SAMPLES) -> None:
    """CIFAR10's python batches: dicts of a uint8 [n, 3072] array and a label list
    (numpy, as the published pickles hold)."""
    import numpy as np

    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with (folder / name).open("wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "labels": [i % 10 for i in range(n)]}, f)
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                     "horse", "ship", "truck"]}, f)


def digit_png() -> bytes:
    """A 28x28 greyscale PNG (Pillow)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("L", (28, 28), DIGIT_PIXELS).save(out, format="PNG")
    return out.getvalue()


def write_example_data(root: Path, images: bool = True) -> None:
    """Everything the examples read, under the data folder ``root``."""
    write_mnist(root)
    write_cifar10(root)
    if images:
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "images" / "test_digit.png").write_bytes(digit_png())


# TrainCNN-MNIST's layer spec and the state_dict CodefyUI's SequentialModel saves for it: its
# sub-layers sit in a ModuleDict named "layers", keyed by the spec's node ids.
CNN_WEIGHTS = {"layers.c1.weight": (32, 1, 3, 3), "layers.c1.bias": (32,), "layers.c2.weight": (64, 32, 3, 3),
               "layers.c2.bias": (64,), "layers.l1.weight": (128, 3136), "layers.l1.bias": (128,),
               "layers.l2.weight": (10, 128), "layers.l2.bias": (10,)}


def cnn_forward(weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """TrainCNN-MNIST's spec written out by hand with torch's functions."""
    for conv in ("c1", "c2"):
        x = functional.max_pool2d(functional.relu(functional.conv2d(
            x, weights[f"layers.{conv}.weight"], weights[f"layers.{conv}.bias"], padding=1)), 2, 2)
    x = functional.relu(functional.linear(x.flatten(1), weights["layers.l1.weight"], weights["layers.l1.bias"]))
    return functional.linear(x, weights["layers.l2.weight"], weights["layers.l2.bias"])
