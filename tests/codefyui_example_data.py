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

EXAMPLES = Path(__file__).parent / "data" / "codefyui_examples"
# Samples per split: 16 is one batch of the examples' DataLoaders (batch 64) and
# exactly the batch InferenceCNN's DatasetBatch takes (16).
SAMPLES = 16


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
    Image.frombytes("L", (28, 28), bytes((i * 7) % 256 for i in range(28 * 28))).save(out, format="PNG")
    return out.getvalue()


def write_example_data(root: Path, images: bool = True) -> None:
    """Everything the examples read, under the data folder ``root``."""
    write_mnist(root)
    write_cifar10(root)
    if images:
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "images" / "test_digit.png").write_bytes(digit_png())
