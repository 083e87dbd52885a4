"""A graph as an API function: ``GraphInput`` and ``GraphOutput`` (CodefyUI's
contract nodes).

``POST /api/graph/run/{name}`` writes each request value, raw, into the
``value`` param of the GraphInput of that name (cdui.graph.contract), and the
node coerces it to its declared type here, in the run's process, on whichever
machine runs it. On a canvas run (or when an optional input is omitted), the
node parses its ``default`` string instead. GraphOutput records its input,
encoded as CodefyUI encodes it, as a ``graph_output`` event, so the API call
collects the results from the run's events whether it ran here or on a worker.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import math
import struct
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, Param, Port
from cdui.nodes.builtin._declared import B, DeclaredNode

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

INPUT_TYPES = ["string", "number", "integer", "boolean", "json", "image"]
# The largest image an API caller may send, in pixels (CodefyUI's budget).
MAX_IMAGE_PIXELS = 25_000_000
# The most tensor elements one output may carry in the answer.
MAX_OUTPUT_ELEMENTS = 65_536
# Nesting of a list/dict output that is encoded (deeper is refused).
MAX_OUTPUT_DEPTH = 16
GRAPH_OUTPUT_EVENT = "graph_output"


class InputError(ValueError):
    """A value that does not fit its GraphInput's type."""


def _coerce(kind: str, value: Any, name: str) -> Any:
    if kind == "string":
        if not isinstance(value, str):
            raise InputError(f"input {name!r} must be a string, got {type(value).__name__}")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"input {name!r} must be a finite number, got {value!r}")
        return float(value)
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()):
            raise InputError(f"input {name!r} must be an integer, got {value!r}")
        return int(value)
    if kind == "boolean":
        if not isinstance(value, bool):
            raise InputError(f"input {name!r} must be true or false, got {value!r}")
        return value
    if kind == "json":
        return value
    raise InputError(f"input {name!r} has type {kind!r}; use one of {INPUT_TYPES}")


def _parse_default(kind: str, text: str, name: str) -> Any:
    """A GraphInput's ``default`` string as a value of its type."""
    t = text.strip()
    try:
        if kind == "string":
            return text
        if kind == "number":
            return _coerce(kind, float(t), name)
        if kind == "integer":
            return _coerce(kind, float(t), name) if "." in t or "e" in t.lower() else int(t)
        if kind == "boolean":
            if t.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return t.lower() in ("true", "1", "yes")
        if kind == "json":
            return json.loads(t) if t else None
    except ValueError:
        raise InputError(f"GraphInput {name!r}: its default {text!r} is not a valid {kind}") from None
    raise InputError(f"input {name!r} has type {kind!r}; use one of {INPUT_TYPES}")


def decode_image(value: Any, name: str, ctx: RunContext) -> Any:
    """Base64 (with or without a ``data:`` prefix) of a PNG/BMP/PPM (or, with
    Pillow, any image) as an RGB (3, H, W) float tensor in [0, 1]."""
    from cdui.nodes.builtin._torchlib.images import load_tensor

    if not isinstance(value, str):
        raise InputError(f"input {name!r} must be a base64 image string, got {type(value).__name__}")
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"input {name!r} is not valid base64") from None
    if raw.startswith(b"\x89PNG\r\n\x1a\n") and len(raw) >= 24:
        width, height = struct.unpack(">II", raw[16:24])
        if width * height > MAX_IMAGE_PIXELS:
            raise InputError(f"input {name!r} is {width}x{height} = {width * height:,} pixels; the most "
                             f"accepted is {MAX_IMAGE_PIXELS:,}")
    path = ctx.run_dir() / f"graph-input-{name}.img"
    path.write_bytes(raw)
    try:
        img = load_tensor(path, "RGB")
    except ValueError as exc:
        raise InputError(f"input {name!r} is not an image cdui can read: {exc}") from None
    finally:
        path.unlink(missing_ok=True)
    if img.shape[1] * img.shape[2] > MAX_IMAGE_PIXELS:
        raise InputError(f"input {name!r} has {img.shape[1] * img.shape[2]:,} pixels; the most accepted "
                         f"is {MAX_IMAGE_PIXELS:,}")
    return img


class GraphInputNode(DeclaredNode):
    NODE_NAME, CATEGORY = "GraphInput", "IO"
    DESCRIPTION = "An input of the graph called as an API function (POST /api/graph/run/{name})"
    OUTPUTS = (Port("value", ANY, "The caller's value, as the declared type"),)
    PARAMS = (Param("name", "string", "input", "The input's name in the request's inputs"),
              Param("type", "select", "string", "Its type", options=INPUT_TYPES),
              B("required", True, "The caller must give it"),
              Param("default", "string", "", "Used when the caller gives none (for image: a file in data/images)"),
              Param("description", "string", "", "Shown to callers"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        name, kind = str(params.get("name") or "input"), str(params.get("type") or "string")
        if "value" in params:
            raw = params["value"]
            return {"value": decode_image(raw, name, ctx) if kind == "image" else _coerce(kind, raw, name)}
        default = str(params.get("default") or "")
        if kind == "image":
            from cdui.nodes.builtin._torchlib.images import load_tensor

            if not default:
                raise InputError(f"GraphInput {name!r}: no image was given and it has no default image")
            return {"value": load_tensor(ctx.resolve_upload("images", default), "RGB")}
        return {"value": _parse_default(kind, default, name)}


def encode_output(value: Any, name: str, depth: int = 0) -> Any:
    """``value`` as CodefyUI's run API answers it: tensors as
    ``{"__type__": "tensor", shape, dtype, values}`` (at most
    MAX_OUTPUT_ELEMENTS), images as ``{"__type__": "image", format, base64}``;
    a model is refused."""
    if depth > MAX_OUTPUT_DEPTH:
        raise OutputError("bad_output", f"output {name!r} nests deeper than {MAX_OUTPUT_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value if not isinstance(value, float) or math.isfinite(value) else str(value)
    try:
        import torch
    except ImportError:  # pragma: no cover - runs always have torch
        torch = None  # type: ignore[assignment]
    if torch is not None:
        if isinstance(value, torch.nn.Module):
            raise OutputError("bad_output", f"output {name!r} is a model ({type(value).__name__}); a model "
                              f"cannot be returned: save it with ModelSaver and return the path")
        if isinstance(value, torch.Tensor):
            if value.numel() > MAX_OUTPUT_ELEMENTS:
                raise OutputError("output_too_large", f"output {name!r} has {value.numel():,} elements; the "
                                  f"most an answer carries is {MAX_OUTPUT_ELEMENTS:,}")
            t = value.detach().cpu()
            values = t.tolist()
            return {"__type__": "tensor", "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                    "values": _finite(values)}
    if type(value).__module__.startswith("PIL."):

        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return {"__type__": "image", "format": "png", "base64": base64.b64encode(buf.getvalue()).decode()}
    if type(value).__module__ == "numpy":
        return encode_output(value.item() if getattr(value, "ndim", 1) == 0 else torch.as_tensor(value), name, depth)
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_OUTPUT_ELEMENTS:
            raise OutputError("output_too_large", f"output {name!r} has {len(value):,} items; the most an "
                              f"answer carries is {MAX_OUTPUT_ELEMENTS:,}")
        return [encode_output(v, name, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): encode_output(v, name, depth + 1) for k, v in value.items()}
    raise OutputError("bad_output", f"output {name!r} is a {type(value).__name__}, which an answer cannot "
                      f"carry; return a tensor, number, string, list or dict")


def _finite(v: Any) -> Any:
    if isinstance(v, list):
        return [_finite(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class OutputError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class GraphOutputNode(DeclaredNode):
    NODE_NAME, CATEGORY = "GraphOutput", "IO"
    DESCRIPTION = "An output of the graph called as an API function: its input is returned under its name"
    INPUTS = (Port("value", ANY, "The value to return"),)
    PARAMS = (Param("name", "string", "output", "The output's name in the answer"),
              Param("description", "string", "", "Shown to callers"))
    # What it gives is an event, not an output: answered from an execution cache (a canvas process's, an
    # app's serving process's) it would give nothing, and the call would end without its value.
    CACHEABLE = False

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        name = str(params.get("name") or "output")
        value = inputs.get("value")
        try:
            encoded = encode_output(value, name)
        except OutputError as exc:
            ctx.emit(GRAPH_OUTPUT_EVENT, {"name": name, "node_id": ctx.node_id,
                                          "error": {"code": exc.code, "message": str(exc)}})
            raise
        ctx.emit(GRAPH_OUTPUT_EVENT, {"name": name, "node_id": ctx.node_id, "value": encoded})
        return {"value": value}
