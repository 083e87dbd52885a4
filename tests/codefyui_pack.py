"""A small plugin pack in CodefyUI's format, written by the tests (tests/test_plugins.py).

Its node files use every part of CodefyUI's node API that the official packs (foundations, deep,
rl, edu) use: ``app.core.node_base`` (BaseNode, PortDefinition with ``optional`` and ``media``,
ParamDefinition with options, bounds, ``visible_when`` and ``advanced``, DataType, ParamType,
MEDIA_*), ``app.core.step_trace.StepRecorder`` (``record(name, text, scalars=..., **tensors)``),
``app.core.stateful_module.StatefulModuleMixin`` (``structural_params``, ``build_module``,
``get_or_build_module``), ``execute(inputs, params, progress_callback=None, *, context=None)`` with
``context.verbose`` and ``__steps__``, ``DETAILS``, a ``nodes/__init__.py`` and a private helper
module imported relatively (as edu's ``_layer_seed``), and an example graph in ``examples/``.
"""
from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

MANIFEST = '''[plugin]
id              = "labpack"
name            = "Lab pack"
version         = "0.2.0"
description     = "Two nodes written against CodefyUI's node API"
schema_version  = 1
requires_codefyui = ">=0.2.0"

[content]
nodes_dir    = "nodes"
examples_dir = "examples"

[lessons]
chapters = ["C1"]
'''

HELPER = '''"""Shared by the pack's nodes (imported relatively)."""
from __future__ import annotations


def scale_of(params):
    return float(params.get("scale", 2.0))
'''

COLUMN_MEAN = '''"""Column means, with the steps recorded in verbose mode."""
from __future__ import annotations

from typing import Any

import torch

from app.core.node_base import (
    MEDIA_IMAGE,
    BaseNode,
    DataType,
    ParamDefinition,
    ParamType,
    PortDefinition,
)
from app.core.step_trace import StepRecorder

from ._helpers import scale_of


class EduColumnMeanNode(BaseNode):
    NODE_NAME = "Edu-ColumnMean"
    CATEGORY = "Classical"
    DESCRIPTION = "Per-column mean, times a scale"
    DETAILS = "Records the column sum and the division as steps."

    @classmethod
    def define_inputs(cls) -> list[PortDefinition]:
        return [PortDefinition(name="table", data_type=DataType.TENSOR, description="2D [rows, cols]."),
                PortDefinition(name="note", data_type=DataType.STRING, optional=True)]

    @classmethod
    def define_outputs(cls) -> list[PortDefinition]:
        return [PortDefinition(name="means", data_type=DataType.TENSOR, description="[cols]"),
                PortDefinition(name="count", data_type=DataType.SCALAR),
                PortDefinition(name="picture", data_type=DataType.STRING, media=MEDIA_IMAGE)]

    @classmethod
    def define_params(cls) -> list[ParamDefinition]:
        return [
            ParamDefinition(name="scale", param_type=ParamType.FLOAT, default=2.0, min_value=0.0, max_value=10.0,
                            description="Multiply the means by this."),
            ParamDefinition(name="mode", param_type=ParamType.SELECT, default="plain", options=["plain", "custom"]),
            ParamDefinition(name="offset", param_type=ParamType.INT, default=0, visible_when={"mode": "custom"},
                            advanced=True),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], progress_callback: Any | None = None,
                *, context: Any = None) -> dict[str, Any]:
        x = inputs.get("table")
        if x is None:
            raise ValueError("EduColumnMean requires a `table` input.")
        x = torch.as_tensor(x, dtype=torch.float32)
        offset = int(params.get("offset", 0)) if params.get("mode") == "custom" else 0
        total = x.sum(dim=0)
        means = total / x.shape[0] * scale_of(params) + offset
        result: dict[str, Any] = {"means": means, "count": float(x.shape[0]), "picture": ""}
        if context is not None and getattr(context, "verbose", False):
            rec = StepRecorder()
            rec.record("col_sum", "Sum along rows.", col_sum=total)
            rec.record("divide", "Divide by the row count, then scale.", scalars={"rows": float(x.shape[0])},
                       means=means)
            result["__steps__"] = rec.steps
        return result
'''

STATEFUL = '''"""A linear layer whose module lives for the run (StatefulModuleMixin)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from app.core.node_base import BaseNode, DataType, ParamDefinition, ParamType, PortDefinition
from app.core.stateful_module import StatefulModuleMixin


class EduTinyLinearNode(StatefulModuleMixin, BaseNode):
    NODE_NAME = "Edu-TinyLinear"
    CATEGORY = "LLM"
    DESCRIPTION = "x -> Linear(D, D), seeded"
    structural_params = ("dim", "seed")

    @classmethod
    def define_inputs(cls) -> list[PortDefinition]:
        return [PortDefinition(name="tensor", data_type=DataType.TENSOR)]

    @classmethod
    def define_outputs(cls) -> list[PortDefinition]:
        return [PortDefinition(name="tensor", data_type=DataType.TENSOR)]

    @classmethod
    def define_params(cls) -> list[ParamDefinition]:
        return [ParamDefinition(name="dim", param_type=ParamType.INT, default=2, min_value=1),
                ParamDefinition(name="seed", param_type=ParamType.INT, default=7)]

    def build_module(self, params: dict[str, Any]) -> nn.Module:
        gen = torch.Generator()
        gen.manual_seed(int(params.get("seed", 7)))
        layer = nn.Linear(int(params.get("dim", 2)), int(params.get("dim", 2)))
        with torch.no_grad():
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen))
            layer.bias.zero_()
        return layer

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], progress_callback: Any | None = None,
                *, context: Any = None) -> dict[str, Any]:
        module = self.get_or_build_module(context, params)
        with torch.no_grad():
            return {"tensor": module(torch.as_tensor(inputs["tensor"], dtype=torch.float32))}
'''


def example_graph(scale: float = 2.0) -> dict:
    """Start -> TensorCreate (ones 3x2) -> labpack:Edu-ColumnMean -> Print; the means are 1.0 * scale."""
    return {
        "name": "Column mean 101",
        "nodes": [
            {"id": "note-1", "type": "note", "data": {"noteContent": "a canvas note, dropped"}},
            {"id": "start", "type": "Start", "data": {"params": {}}},
            {"id": "ones", "type": "TensorCreate", "data": {"params": {"shape": "3,2", "fill": "ones"}}},
            {"id": "mean", "type": "labpack:Edu-ColumnMean", "data": {"params": {"scale": scale}}},
            {"id": "lin", "type": "labpack:Edu-TinyLinear", "data": {"params": {"dim": 2}}},
            {"id": "print", "type": "Print", "data": {"params": {"label": "means"}}},
        ],
        "edges": [
            {"id": "t", "source": "start", "target": "ones", "sourceHandle": "trigger", "type": "trigger"},
            {"id": "a", "source": "ones", "target": "mean", "sourceHandle": "tensor", "targetHandle": "table"},
            {"id": "b", "source": "mean", "target": "print", "sourceHandle": "means", "targetHandle": "value"},
            {"id": "c", "source": "mean", "target": "lin", "sourceHandle": "means", "targetHandle": "tensor"},
        ],
    }


def write_pack(folder: Path, extra_files: dict[str, str] | None = None) -> Path:
    """The pack's folder, written under ``folder/labpack``."""
    root = folder / "labpack"
    files = {"cdui.plugin.toml": MANIFEST, "nodes/__init__.py": "", "nodes/_helpers.py": HELPER,
             "nodes/edu_column_mean_node.py": COLUMN_MEAN, "nodes/edu_tiny_linear_node.py": STATEFUL,
             "examples/C1-1/Column-Mean-101/graph.json": json.dumps(example_graph(), indent=2),
             **(extra_files or {})}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def tar_of(folder: Path, out: Path) -> Path:
    """``folder`` as a .tar.gz with the folder as its one top-level entry (as packs are published)."""
    with tarfile.open(out, "w:gz") as tf:
        tf.add(folder, arcname=folder.name)
    return out


def hostile_tar(out: Path, kind: str) -> Path:
    """A .tar.gz holding a valid pack plus one hostile member of ``kind``."""
    with tarfile.open(out, "w:gz") as tf:
        def add(name: str, data: bytes = b"", **attrs: object) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in attrs.items():
                setattr(info, k, v)
            tf.addfile(info, io.BytesIO(data) if data else None)
        add("labpack/cdui.plugin.toml", MANIFEST.encode())
        add("labpack/nodes/edu_column_mean_node.py", COLUMN_MEAN.encode())
        if kind == "dotdot":
            add("labpack/../../escaped.py", b"x = 1\n")
        elif kind == "absolute":
            add("/tmp/cdui-absolute-escape.py", b"x = 1\n")
        elif kind == "symlink":
            add("labpack/nodes/link.py", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        elif kind == "device":
            add("labpack/dev0", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
    return out


def hostile_zip(out: Path) -> Path:
    """A .zip holding a valid pack and a member that climbs out with '..'."""
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("labpack/cdui.plugin.toml", MANIFEST)
        zf.writestr("labpack/nodes/edu_column_mean_node.py", COLUMN_MEAN)
        zf.writestr("../zip-escaped.py", "x = 1\n")
    return out
