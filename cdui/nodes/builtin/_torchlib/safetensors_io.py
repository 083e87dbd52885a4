"""Read and write ``.safetensors`` files, with or without the package.

The format is small enough to write by hand: an 8-byte little-endian header
length, a JSON header mapping each tensor name to its dtype, shape and byte
range, then the raw little-endian bytes. The ``safetensors`` package is used
when it is installed; files written either way are interchangeable.
"""
from __future__ import annotations

import importlib
import json
import struct
from pathlib import Path
from typing import Any

import torch

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def _library() -> Any:
    """safetensors' torch module when the package is installed, else None."""
    try:
        return importlib.import_module("safetensors.torch")
    except ImportError:
        return None


def save_file(tensors: dict[str, torch.Tensor], path: Path) -> None:
    lib = _library()
    if lib is not None:
        lib.save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
        return
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous().clone()  # clone: the storage is exactly this tensor
        if t.dtype not in _DTYPES:
            raise ValueError(f"safetensors: tensor {name!r} has unsupported dtype {t.dtype}")
        raw = bytes(t.untyped_storage()) if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for raw in chunks:
            fh.write(raw)


def load_file(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    lib = _library()
    if lib is not None:
        return dict(lib.load_file(str(path), device=device))
    data = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    base = 8 + size
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _BY_NAME.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"safetensors: tensor {name!r} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        buf = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).to(device)
    return out
