"""Images as tensors, and a dataset of class folders.

``load_tensor`` gives what torchvision's ``ToTensor`` gives for a PIL image
converted to ``mode``: float32 (C, H, W) in [0, 1]. Grey is PIL's ``L``
conversion (ITU-R 601-2 luma, rounded). ``ImageFolder`` follows torchvision:
classes are the sorted sub-folder names, files are taken in sorted order.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cdui.nodes.builtin._imagecodec import CHANNELS, IMAGE_EXTENSIONS, read_image, write_image


def _convert(t: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """Convert a uint8 (C, H, W) tensor between L/LA/RGB/RGBA like PIL does."""
    if src == dst:
        return t
    color = t[:1].repeat(3, 1, 1) if src in ("L", "LA") else t[:3]
    alpha = t[-1:] if src in ("LA", "RGBA") else torch.full_like(t[:1], 255)
    if dst == "RGB":
        return color
    if dst == "RGBA":
        return torch.cat([color, alpha])
    c = color.to(torch.int32)
    # PIL: L = R * 299/1000 + G * 587/1000 + B * 114/1000, rounded.
    grey = ((c[0] * 19595 + c[1] * 38470 + c[2] * 7471 + 0x8000) >> 16).to(torch.uint8)[None]
    return grey if dst == "L" else torch.cat([grey, alpha])


def load_uint8(path: Path, mode: str = "RGB") -> torch.Tensor:
    if mode not in CHANNELS:
        raise ValueError(f"unsupported image mode {mode!r}; use RGB, L or RGBA")
    width, height, src, pixels = read_image(path)
    t = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(height, width, CHANNELS[src])
    return _convert(t.permute(2, 0, 1).contiguous(), src, mode)


def resize_uint8(t: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear, antialiased resize to (size, size), rounded back to 8 bits."""
    out = F.interpolate(t[None].float(), size=(size, size), mode="bilinear",
                        align_corners=False, antialias=True)[0]
    return out.round().clamp(0, 255).to(torch.uint8)


def load_tensor(path: Path, mode: str = "RGB", resize: int = 0) -> torch.Tensor:
    t = load_uint8(path, mode)
    if resize and resize > 0:
        t = resize_uint8(t, resize)
    return t.float() / 255.0


def save_tensor(image: torch.Tensor, path: Path, fmt: str) -> None:
    """torchvision ``save_image`` rules: [0, 1] floats, first of a batch, and a
    single channel written as grey RGB."""
    img = image.detach().cpu()
    if img.dim() == 4:
        img = img[0]
    if img.dim() == 2:
        img = img[None]
    if img.dim() != 3 or img.shape[0] not in (1, 3, 4):
        raise ValueError(f"ImageWriter: expected an image tensor (C, H, W) with 1, 3 or 4 channels, "
                         f"got shape {tuple(image.shape)}")
    if img.shape[0] == 1:
        img = img.repeat(3, 1, 1)
    mode = "RGB" if img.shape[0] == 3 else "RGBA"
    u8 = img.float().mul(255).add_(0.5).clamp_(0, 255).to(torch.uint8)
    pixels = u8.permute(1, 2, 0).contiguous().flatten().tolist()
    write_image(path, img.shape[2], img.shape[1], mode, bytes(pixels), fmt)


class ImageFolder(Dataset):
    """``root/<class>/<image>``; items are ``(tensor, class index)``."""

    def __init__(self, root: Path, transform: Callable[[Any], Any] | None = None) -> None:
        self.root = Path(root)
        self.transform = transform
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        for c in self.classes:
            for f in sorted((self.root / c).rglob("*")):
                if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS:
                    self.samples.append((str(f), self.class_to_idx[c]))
        self.targets = [t for _, t in self.samples]
        if not self.samples:
            raise ValueError(f"no images found under {self.root} (extensions: {', '.join(IMAGE_EXTENSIONS)})")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        if self.transform is not None and getattr(self.transform, "takes_raw", False):
            # Transform's pipeline replaces ToTensor: it gets the 8-bit image
            return self.transform(load_uint8(Path(path), "RGB")), target
        image = load_tensor(Path(path), "RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, target
