"""A recorded node's summary as it crosses the wire: its bounds, and its rebuild on the way in.

The run process writes summaries within these bounds (:mod:`cdui.run.outputs`); a worker may
still send anything, so the control plane rebuilds what a worker answers (an ``outputs_answer``,
:mod:`cdui.wire.protocol`) from the known fields only, each typed and bounded, before the web
page sees it.
"""
from __future__ import annotations

import base64
import math
from typing import Any

MAX_OUTPUTS = 64                   # outputs of one node summarized
MAX_NODES = 10000                  # nodes recorded in one run
MAX_SHAPE = 16                     # dimensions of a shape
MAX_NODE_ID = 256                  # characters of a node id on the wire
MAX_NOTE = 500                     # characters of a note or a value's text
MAX_THUMB_B64 = 64 * 1024          # characters of one thumbnail, base64
MAX_PREVIEW = 16                   # rows, and values in a row, of a tensor's values preview
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _text(v: Any, limit: int) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected text, got {type(v).__name__}")
    if len(v) > limit:
        raise ValueError(f"a text of {len(v)} characters is over the limit of {limit}")
    return v


def clean_summary(raw: Any, node_id: str) -> dict[str, Any]:
    """A worker's summary rebuilt from the known fields only, each typed and bounded.

    Raises ValueError saying what does not fit. The thumbnail must be base64 of a PNG."""
    if not isinstance(raw, dict):
        raise ValueError(f"a summary must be an object, got {type(raw).__name__}")
    if raw.get("node_id") != node_id:
        raise ValueError("the summary is for another node")
    outs = raw.get("outputs")
    if not isinstance(outs, list) or len(outs) > MAX_OUTPUTS:
        raise ValueError(f"outputs must be a list of at most {MAX_OUTPUTS}")
    clean: list[dict[str, Any]] = []
    for o in outs:
        if not isinstance(o, dict):
            raise ValueError("each output must be an object")
        c: dict[str, Any] = {"port": _text(o.get("port", ""), 128), "kind": _text(o.get("kind", "value"), 32)}
        if "shape" in o:
            shape = o["shape"]
            if not isinstance(shape, list) or len(shape) > MAX_SHAPE or not all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 53 for x in shape):
                raise ValueError(f"a shape must be at most {MAX_SHAPE} sizes")
            c["shape"] = list(shape)
        if "dtype" in o:
            c["dtype"] = _text(o["dtype"], 32)
        for k in ("min", "max", "mean"):
            if k in o and o[k] is not None:
                v = _num(o[k])
                if v is None:
                    raise ValueError(f"{k} must be a finite number")
                c[k] = v
        if "nonfinite" in o:
            n = o["nonfinite"]
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 2 ** 53:
                raise ValueError("nonfinite must be a count")
            c["nonfinite"] = n
        if "note" in o:
            c["note"] = _text(o["note"], MAX_NOTE)
        if "preview" in o:
            c["preview"] = clean_preview(o["preview"])
        if "thumbnail" in o:
            thumb = _text(o["thumbnail"], MAX_THUMB_B64)
            try:
                data = base64.b64decode(thumb, validate=True)
            except ValueError:
                raise ValueError("a thumbnail must be base64") from None
            if not data.startswith(PNG_MAGIC):
                raise ValueError("a thumbnail must be a PNG")
            c["thumbnail"] = thumb
        clean.append(c)
    return {"node_id": node_id, "type": _text(raw.get("type", ""), 128), "outputs": clean}


def clean_preview(raw: Any) -> list[list[float | None]]:
    """A values preview: at most MAX_PREVIEW rows of at most MAX_PREVIEW numbers (null: not finite)."""
    if not isinstance(raw, list) or len(raw) > MAX_PREVIEW or not all(
            isinstance(row, list) and len(row) <= MAX_PREVIEW for row in raw):
        raise ValueError(f"a preview must be at most {MAX_PREVIEW} rows of at most {MAX_PREVIEW} values")
    out: list[list[float | None]] = []
    for row in raw:
        if not all(v is None or _num(v) is not None for v in row):
            raise ValueError("a preview holds finite numbers or null")
        out.append([None if v is None else float(v) for v in row])
    return out


def clean_nodes(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or len(raw) > MAX_NODES:
        raise ValueError(f"nodes must be a list of at most {MAX_NODES}")
    out = []
    for n in raw:
        if not isinstance(n, dict):
            raise ValueError("each node must be an object")
        out.append({"node_id": _text(n.get("node_id"), MAX_NODE_ID), "type": _text(n.get("type", ""), 128)})
    return out
