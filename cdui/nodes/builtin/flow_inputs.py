"""CodefyUI's small Data Flow and Data nodes: Switch, Reduce, TextInput,
TensorInput, RowSelector, and the training inspector's BackwardOnce."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, LIST, SCALAR, STRING, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, I, T, int_param
from cdui.nodes.builtin._util import parse_int_list, shape_problem

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

# Bounds on what TensorInput builds and Reduce aggregates, checked before any work.
MAX_TENSOR_ELEMENTS = 16 * 1024 * 1024
MAX_REDUCE_ITEMS = 100_000
MAX_TEXT = 1024 * 1024


class SwitchNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Switch", "Data Flow"
    DESCRIPTION = "Forwards input_<selector>; input_0 when that port has no value"
    INPUTS = (Port("selector", SCALAR, "Which input to forward (0-3); 0 when absent"),
              Port("input_0", ANY, "Candidate 0, also the fallback"),
              Port("input_1", ANY, "Candidate 1", optional=True), Port("input_2", ANY, "Candidate 2", optional=True),
              Port("input_3", ANY, "Candidate 3", optional=True))
    OUTPUTS = (Port("output", ANY, "The selected value"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        raw: Any = inputs.get("selector")
        if raw is not None and hasattr(raw, "item"):
            raw = raw.item()
        try:
            index = 0 if raw is None else int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"Switch: selector {raw!r} is not a number") from None
        chosen = inputs.get(f"input_{index}") if 0 <= index <= 3 else None
        return {"output": chosen if chosen is not None else inputs.get("input_0")}


class ReduceNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Reduce", "Data Flow"
    DESCRIPTION = "Aggregates a list: sum, mean, min, max, concat, stack, first or last"
    INPUTS = (Port("items", LIST, "The items (tensors or numbers)"),)
    OUTPUTS = (Port("result", ANY, "The aggregate"), Port("count", SCALAR, "Number of items"))
    PARAMS = (Param("operation", "select", "mean", "How the items are combined",
                    options=["sum", "mean", "min", "max", "concat", "stack", "first", "last"]),
              I("dim", 0, "Dim of concat and stack"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        items = inputs.get("items")
        if items is None:
            items = []
        if isinstance(items, torch.Tensor):
            items = list(items)
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"Reduce: items must be a list, got {type(items).__name__}")
        if len(items) > MAX_REDUCE_ITEMS:
            raise ValueError(f"Reduce: more than {MAX_REDUCE_ITEMS} items")
        op = str(params.get("operation") or "mean")
        if not items:
            raise ValueError("Reduce: the items list is empty")
        if op == "first":
            return {"result": items[0], "count": float(len(items))}
        if op == "last":
            return {"result": items[-1], "count": float(len(items))}
        tensors = []
        for i, x in enumerate(items):
            # Only numbers (and lists of them) and tensors combine; say which item is not one.
            if isinstance(x, (str, bytes)) or x is None or isinstance(x, dict):
                raise ValueError(f"Reduce: {op} needs numeric items (numbers or tensors), but item {i} is "
                                 f"{type(x).__name__} {str(x)[:40]!r}; use first or last for other items")
            try:
                tensors.append(x if isinstance(x, torch.Tensor) else torch.as_tensor(x))
            except (TypeError, ValueError, RuntimeError):
                raise ValueError(f"Reduce: {op} needs numeric items (numbers or tensors), but item {i} is "
                                 f"{type(x).__name__} {str(x)[:40]!r}") from None
        dim = int_param(params, "dim", 0)
        try:
            if op == "concat":
                result = torch.cat(tensors, dim=dim)
            elif op == "stack":
                result = torch.stack(tensors, dim=dim)
            elif op in ("sum", "mean", "min", "max"):
                stacked = torch.stack(tensors)
                if op == "mean" and not stacked.is_floating_point():
                    stacked = stacked.float()
                result = {"sum": lambda s: s.sum(0), "mean": lambda s: s.mean(0),
                          "min": lambda s: s.min(0).values, "max": lambda s: s.max(0).values}[op](stacked)
            else:
                raise ValueError(f"Reduce: unknown operation {op!r}")
        except RuntimeError as exc:
            raise ValueError(f"Reduce: the items cannot be combined by {op} ({exc})") from None
        return {"result": result, "count": float(len(items))}


class TextInputNode(DeclaredNode):
    NODE_NAME, CATEGORY = "TextInput", "Data"
    DESCRIPTION = "Emits its value param as a string"
    OUTPUTS = (Port("text", STRING, "The text"),)
    # A graph that leaves the value out gets "" (CodefyUI's node falls back to it), not the sample.
    PARAMS = (Param("value", "string", "The quick brown fox jumps over the lazy dog.", "The text", absent=""),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        text = str(params.get("value") if params.get("value") is not None else "")
        if len(text) > MAX_TEXT:
            raise ValueError(f"TextInput: the value is longer than {MAX_TEXT} characters")
        return {"text": text}


_DTYPES = ["float32", "float64", "int64", "int32", "bool"]


class TensorInputNode(DeclaredNode):
    NODE_NAME, CATEGORY = "TensorInput", "Data"
    DESCRIPTION = "A tensor of a given shape and dtype: explicit values, seeded random, zeros, ones or arange"
    OUTPUTS = (T("tensor", "The tensor"),)
    PARAMS = (Param("shape", "string", "1,4,4", "Comma-separated dims"),
              Param("dtype", "select", "float32", "Element type", options=_DTYPES),
              Param("value_mode", "select", "random", "How the values are made",
                    options=["explicit", "random", "zeros", "ones", "arange"]),
              Param("values", "tensor_grid", None, "Nested list of values, for explicit mode"),
              I("seed", 0, "Seed of random mode"))

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[tuple[str, str]]:
        return shape_problem("shape", params.get("shape", "1,4,4"), MAX_TENSOR_ELEMENTS, max_dims=8, allow_empty=True)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        dtype_name = str(params.get("dtype") or "float32")
        if dtype_name not in _DTYPES:
            raise ValueError(f"TensorInput: unknown dtype {dtype_name!r}")
        dtype = getattr(torch, dtype_name)
        shape = tuple(parse_int_list(params.get("shape", "1,4,4"), "shape"))
        if len(shape) > 8 or any(d <= 0 for d in shape):
            raise ValueError(f"TensorInput: shape {params.get('shape')!r} needs 1-8 positive dims")
        if math.prod(shape) > MAX_TENSOR_ELEMENTS:
            raise ValueError(f"TensorInput: shape {shape} has more than {MAX_TENSOR_ELEMENTS} elements")
        mode = str(params.get("value_mode") or "random")
        if mode == "explicit":
            values = params.get("values")
            if values is None:
                raise ValueError("TensorInput: explicit mode needs the values param")
            try:
                x = torch.tensor(values, dtype=dtype)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ValueError(f"TensorInput: values are not a rectangular nested list of numbers ({exc})") \
                    from None
            if x.numel() != math.prod(shape):
                raise ValueError(f"TensorInput: {x.numel()} values do not fill shape {shape}")
            x = x.reshape(shape)
        elif mode == "random":
            gen = torch.Generator().manual_seed(int_param(params, "seed", 0))
            if dtype_name == "bool":
                x = torch.randint(0, 2, shape, generator=gen).bool()
            elif dtype_name.startswith("int"):
                x = torch.randint(0, 10, shape, generator=gen, dtype=dtype)
            else:
                x = torch.randn(shape, generator=gen, dtype=dtype)
        elif mode == "zeros":
            x = torch.zeros(shape, dtype=dtype)
        elif mode == "ones":
            x = torch.ones(shape, dtype=dtype)
        elif mode == "arange":
            x = torch.arange(math.prod(shape)).reshape(shape).to(dtype)
        else:
            raise ValueError(f"TensorInput: unknown value_mode {mode!r}")
        return {"tensor": x.to(ctx.device)}


class RowSelectorNode(DeclaredNode):
    NODE_NAME, CATEGORY = "RowSelector", "Data"
    DESCRIPTION = "Picks dim-0 rows by position, or by name from a labels list"
    INPUTS = (T("tensor", "Rows to pick from"), Port("labels", LIST, "A name per row, for names", optional=True))
    OUTPUTS = (T("tensor", "The picked rows"),)
    PARAMS = (Param("indices", "string", "0", "Comma-separated row positions (negative counts from the end)"),
              Param("names", "string", "", "Comma-separated row names; used instead of indices when given"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        x = self.tensor(inputs)
        if x.dim() == 0:
            raise ValueError("RowSelector: a 0-d tensor has no rows")
        names = [n.strip() for n in str(params.get("names") or "").split(",") if n.strip()]
        if names:
            labels = [str(label) for label in (inputs.get("labels") or [])]
            if not labels:
                raise ValueError("RowSelector: names need the labels input")
            missing = [n for n in names if n not in labels]
            if missing:
                raise ValueError(f"RowSelector: {', '.join(missing)} not among the labels")
            rows = [labels.index(n) for n in names]
        else:
            rows = parse_int_list(params.get("indices", "0"), "indices")
            if not rows:
                raise ValueError("RowSelector: give indices or names")
        n = int(x.shape[0])
        bad = [r for r in rows if not -n <= r < n]
        if bad:
            raise ValueError(f"RowSelector: rows {bad} are outside 0..{n - 1}")
        return {"tensor": x[rows]}


class BackwardOnceNode(DeclaredNode):
    NODE_NAME, CATEGORY = "BackwardOnce", "Training"
    CACHEABLE = False  # draws from the process's random generator
    DESCRIPTION = "Identity; marks the tensor CodefyUI's backward inspector differentiates"
    INPUTS = (T("tensor", "Any tensor"),)
    OUTPUTS = (T("tensor", "The same tensor"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        return {"tensor": self.tensor(inputs)}
