"""Image datasets generated in memory: SyntheticSegmentation and SyntheticShapes.

Both draw from numpy's ``default_rng(seed)`` in the same order as CodefyUI, so
a seed gives the very images CodefyUI gives (numpy's generator is the
reference; torch's would give other numbers). numpy comes with the ``vision``
extra. The datasets are plain indexable objects that already hold tensors; as
in CodefyUI they take no ``transform`` (a Transform wired after them changes
nothing).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import DATASET, Port
from cdui.nodes.builtin._declared import DeclaredNode, F, I, float_param, int_param

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

# A generated dataset lives in the run's memory: bound the pixels it may hold
# (256 MiB of float32) before drawing any of them.
MAX_PIXELS = 64 * 1024 * 1024


class GeneratedImages:
    """Pre-drawn ``(image, target)`` pairs."""

    def __init__(self, images: list[Any], targets: list[Any]) -> None:
        self.images, self.targets = images, targets

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.images[index], self.targets[index]

    def __repr__(self) -> str:
        shape = tuple(self.images[0].shape) if self.images else ()
        return f"<{len(self)} generated images of shape {shape}>"


def _check_size(node: str, n: int, size: int) -> None:
    if n * size * size > MAX_PIXELS:
        raise ValueError(f"{node}: {n} images of {size}x{size} are {n * size * size:,} pixels, more than the "
                         f"{MAX_PIXELS:,} a generated dataset may hold; lower n_samples or image_size")


def segmentation_samples(n_samples: int, image_size: int, noise: float, seed: int) -> GeneratedImages:
    """Images with one or two shapes (circle: value 0.7, class 1; rectangle: 1.0, class 2)
    and their per-pixel class masks."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    size = image_size
    rows, cols = np.mgrid[0:size, 0:size]
    images, masks = [], []
    for _ in range(n_samples):
        img = np.zeros((size, size), dtype=np.float32)
        mask = np.zeros((size, size), dtype=np.int64)
        for _shape in range(int(rng.integers(1, 3))):
            if rng.random() < 0.5:
                r = int(rng.integers(size // 8, size // 4))
                cy, cx = int(rng.integers(r, size - r)), int(rng.integers(r, size - r))
                inside = (rows - cy) ** 2 + (cols - cx) ** 2 <= r * r
                img[inside], mask[inside] = 0.7, 1
            else:
                h, w = int(rng.integers(size // 6, size // 3)), int(rng.integers(size // 6, size // 3))
                top, left = int(rng.integers(0, size - h)), int(rng.integers(0, size - w))
                img[top:top + h, left:left + w] = 1.0
                mask[top:top + h, left:left + w] = 2
        if noise > 0:
            img = img + rng.normal(0.0, noise, size=img.shape).astype(np.float32)
        images.append(torch.from_numpy(np.clip(img, 0.0, 1.0)).unsqueeze(0))
        masks.append(torch.from_numpy(mask))
    return GeneratedImages(images, masks)


def blob_samples(n_samples: int, image_size: int, seed: int) -> GeneratedImages:
    """One soft Gaussian blob per image, scaled to [-1, 1]; every target is 0."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    size = image_size
    rows, cols = np.mgrid[0:size, 0:size].astype("float32")
    margin = max(2, size // 3)
    images = []
    for _ in range(n_samples):
        cy, cx = rng.uniform(margin, size - margin), rng.uniform(margin, size - margin)
        sigma = rng.uniform(size / 5.0, size / 3.5)
        blob = np.exp(-(((rows - cy) ** 2 + (cols - cx) ** 2) / (2 * sigma * sigma))).astype("float32")
        images.append(torch.from_numpy(blob * 2.0 - 1.0).unsqueeze(0))
    return GeneratedImages(images, [0] * n_samples)


class _Generated(DeclaredNode):
    NEEDS: ClassVar[tuple[str, ...]] = ("numpy",)
    EXTRA: ClassVar[str | None] = "vision"


class SyntheticSegmentationNode(_Generated):
    NODE_NAME, CATEGORY = "SyntheticSegmentation", "Data"
    DESCRIPTION = "Generate images with per-pixel masks (0 background, 1 circle, 2 rectangle)"
    OUTPUTS = (Port("dataset", DATASET, "(image (1, H, W) float in [0, 1], mask (H, W) long) pairs"),)
    PARAMS = (I("image_size", 64, "Side of the square images in pixels", lo=16),
              I("n_samples", 200, "Number of images", lo=4),
              F("noise", 0.05, "Standard deviation of the Gaussian noise added to the images (not the masks)",
                lo=0.0),
              I("seed", 42, "Random seed; use different seeds for the training and test sets"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        size, n = int_param(params, "image_size", 64), int_param(params, "n_samples", 200)
        _check_size(self.NODE_NAME, n, size)
        return {"dataset": segmentation_samples(n, size, float_param(params, "noise", 0.05),
                                                int_param(params, "seed", 42))}


class SyntheticShapesNode(_Generated):
    NODE_NAME, CATEGORY = "SyntheticShapes", "Data"
    DESCRIPTION = "Generate small single-channel images of one soft blob each, in [-1, 1] (for diffusion models)"
    OUTPUTS = (Port("dataset", DATASET, "(image (1, H, W) float in [-1, 1], 0) pairs"),)
    PARAMS = (I("image_size", 24, "Side of the square images in pixels", lo=8),
              I("n_samples", 384, "Number of images", lo=8),
              I("seed", 0, "Random seed: where the blobs sit and how large they are"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        size, n = int_param(params, "image_size", 24), int_param(params, "n_samples", 384)
        _check_size(self.NODE_NAME, n, size)
        return {"dataset": blob_samples(n, size, int_param(params, "seed", 0))}
