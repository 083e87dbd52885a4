"""Tabular data nodes: CSVReader, ColumnSelector, Normalize, TrainTestSplit,
TensorCreate and Mean.

Ports, params and results follow CodefyUI (which uses pandas and
scikit-learn); cdui reproduces them with the standard library and torch:

- CSVReader: a column is a feature when every cell parses as a number (empty
  cells become NaN, as pandas reads them); labels are strings, integral
  numbers written without a fraction (pandas reads ``01`` as ``1``);
- TrainTestSplit: the exact rows sklearn's ``train_test_split`` picks for a
  seed (see :mod:`cdui.nodes.builtin._sklearn_compat`).
"""
from __future__ import annotations

import csv
import math
import re
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import ANY, LIST, TENSOR, Node, Param, Port
from cdui.nodes.builtin import _sklearn_compat as skc
from cdui.nodes.builtin._util import as_bool, as_list, as_tensor, parse_int_list, parse_shape, shape_problem

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext



_UNIT = re.compile(r"\s*\([^()]*\)\s*$")


def _column_key(name: str) -> str:
    """A column name as compared when it is not found as written: case, a trailing unit in brackets and
    the separators left out, so scikit-learn's "petal length (cm)" finds the sample's "petal_length"."""
    return re.sub(r"[\s_\-]+", "_", _UNIT.sub("", name).strip().lower())


def _column(name: str, header: list[str], ctx: RunContext) -> str:
    """``name`` as the file writes it: itself when the header has it, else the one header column with its
    key (and a log line saying so); unchanged when none or several match (the caller's error lists them)."""
    if not name or name in header:
        return name
    same = [h for h in header if _column_key(h) == _column_key(name)]
    if len(same) != 1:
        return name
    ctx.log(f"CSVReader: column {name!r} read as the file's {same[0]!r}")
    return same[0]

def _number(cell: str) -> float | None:
    """The float a CSV cell holds, NaN for an empty cell, None if not numeric."""
    text = cell.strip()
    if text == "" or text.lower() in ("nan", "na", "n/a", "null"):
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def _label_strings(cells: list[str]) -> list[str]:
    """Labels as CodefyUI's ``str(pandas value)`` spells them."""
    nums = [_number(c) for c in cells]
    if cells and all(n is not None and not math.isnan(n) for n in nums):
        present = [n for n in nums if n is not None]  # every one, as just checked
        if all(n.is_integer() and "." not in c and "e" not in c.lower()
               for n, c in zip(present, cells, strict=True)):
            return [str(int(n)) for n in present]
        return [str(float(n)) for n in nums]  # type: ignore[arg-type]
    return list(cells)


class CSVReaderNode(Node):
    NODE_NAME = "CSVReader"
    CATEGORY = "Data"
    DESCRIPTION = ("Load a CSV into a feature tensor + label list. Numeric columns "
                   "(filtered by `include_columns` if set) become a [N, F] float32 "
                   "tensor; the column named in `target_column` becomes a list of "
                   "string labels for downstream classifier nodes.")

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("tensor", TENSOR, "Float32 [N, F] tensor of feature columns."),
            Port("labels", LIST, "String labels from `target_column` (empty list when no target column set)."),
            Port("columns", LIST, "Names of the feature columns in tensor order."),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        # An upload field (the data-file fields of CSVReader decide whether a run uses files):
        # a name in data/files (`train.csv`), or a data/... path such as the
        # built-in sample data/samples/iris.csv, which every installation has.
        return [
            Param("path", "data_file", "data/samples/iris.csv",
                  "The CSV file: an uploaded file's name (data/files), or a data/... path "
                  "such as data/samples/iris.csv."),
            Param("target_column", "string", "",
                  "Optional name of the label column. Leave blank for unsupervised loading."),
            Param("include_columns", "string", "",
                  "Optional comma-separated list of feature columns to keep. "
                  "Empty means 'all numeric columns except the target'."),
            Param("skip_header", "bool", True,
                  "True when the first row is a header. False generates 0-indexed column names."),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        value = str(params.get("path") or "").strip()
        if not value:
            raise ValueError("CSVReader needs a `path`; e.g. data/samples/iris.csv")
        path = ctx.resolve_upload("files", value)
        if not path.is_file():
            raise FileNotFoundError(f"CSVReader: file not found: {value!r} (looked at {path}); upload it with "
                                    f"POST /api/files/upload or give a data/... path")
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
        if as_bool(params.get("skip_header"), True):
            header, rows = (rows[0], rows[1:]) if rows else ([], [])
        else:
            header = [str(i) for i in range(max((len(r) for r in rows), default=0))]
        header = [h.strip() for h in header]
        width = len(header)
        for i, r in enumerate(rows):
            if len(r) != width:
                raise ValueError(f"CSVReader: row {i + 2} has {len(r)} cells, the header has {width}")
        columns = {name: [r[j] for r in rows] for j, name in enumerate(header)}

        target = _column(str(params.get("target_column") or "").strip(), header, ctx)
        if target and target not in columns:
            raise ValueError(f"CSVReader: target_column={target!r} is not in the file. "
                             f"Available columns: {header}")
        include = [_column(c.strip(), header, ctx)
                   for c in str(params.get("include_columns") or "").split(",") if c.strip()]
        if include:
            missing = [c for c in include if c not in columns]
            if missing:
                raise ValueError(f"CSVReader: include_columns references unknown columns: "
                                 f"{missing}. Available: {header}")
            features = include
        else:
            features = [c for c in header if c != target]
            if rows:  # a header-only file keeps its column names
                features = [c for c in features
                            if all(_number(v) is not None for v in columns[c])]

        data = []
        for c in features:
            nums = [_number(v) for v in columns[c]]
            bad = [v for v, n in zip(columns[c], nums, strict=True) if n is None]
            if bad:
                raise ValueError(f"CSVReader: column {c!r} is not numeric (e.g. {bad[0]!r}); "
                                 f"leave it out of include_columns")
            data.append(nums)
        if features:
            tensor = torch.tensor(data, dtype=torch.float32).T.contiguous()
        else:
            tensor = torch.zeros((len(rows), 0), dtype=torch.float32)
        labels = _label_strings(columns[target]) if target else []
        return {"tensor": tensor, "labels": labels, "columns": list(features)}


class ColumnSelectorNode(Node):
    NODE_NAME = "ColumnSelector"
    CATEGORY = "Data"
    DESCRIPTION = "Pick columns from a 2D tensor, by index or name"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("tensor", TENSOR, "Input 2D tensor [rows, cols]."),
            Port("columns", LIST, "Optional list of column names, required when selecting by `names`.",
                 optional=True),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Tensor of shape [rows, len(selected_cols)].")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("indices", "string", "0",
                  "Comma-separated column indices, e.g. '0,2,3'. Used when `names` is empty."),
            Param("names", "string", "",
                  "Comma-separated column names. When set, takes precedence over `indices` "
                  "and requires the `columns` input to be connected."),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        x = as_tensor(inputs.get("tensor"), "tensor")
        n_cols = x.shape[-1] if x.ndim >= 1 else 0
        names = [c.strip() for c in str(params.get("names") or "").split(",") if c.strip()]
        if names:
            cols_in = inputs.get("columns")
            if not cols_in:
                raise ValueError("ColumnSelector: `names` is set but no `columns` input is connected; "
                                 "connect CSVReader.columns or use `indices` instead")
            cols = [str(c) for c in cols_in]
            missing = [c for c in names if c not in cols]
            if missing:
                raise ValueError(f"ColumnSelector: names {missing} not in columns input {cols}")
            indices = [cols.index(c) for c in names]
        else:
            indices = parse_int_list(params.get("indices"), "indices")
            for i in indices:
                if i < 0 or i >= n_cols:
                    raise ValueError(f"ColumnSelector: indices contains out-of-range value {i} "
                                     f"(tensor has {n_cols} cols)")
        return {"tensor": x[..., indices] if indices else x[..., :0]}


class NormalizeNode(Node):
    NODE_NAME = "Normalize"
    CATEGORY = "Data"
    DESCRIPTION = "Normalise a tensor along one axis; outputs the stats"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("tensor", TENSOR, "Input tensor; the normalisation runs along `axis`."),
            Port("stats", ANY, "Optional `stats` output of another Normalize; when wired, those "
                 "statistics are applied instead of fitting new ones.", optional=True),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("tensor", TENSOR, "Normalised tensor, same shape as input."),
            Port("stats", ANY, "Dict of the statistics used (mean/std, min/max or norm)."),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("mode", "select", "zscore", "Normalisation recipe.",
                  options=["zscore", "minmax", "unit_norm"]),
            Param("axis", "int", 0, "Axis along which to compute statistics. 0 = per-column, 1 = per-row."),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        x = as_tensor(inputs.get("tensor"), "tensor").float()
        axis = int(params.get("axis", 0))
        if not -x.dim() <= axis < x.dim():
            raise ValueError(f"Normalize: axis={axis} is out of range for a {x.dim()}-D tensor")
        fitted = inputs.get("stats")
        if fitted is not None:
            return {"tensor": _apply_stats(x, fitted, axis), "stats": fitted}

        def safe(t: Any) -> Any:
            # A constant column is divided by 1, so it comes out as zeros, not NaN.
            return torch.where(t == 0, torch.ones_like(t), t)

        mode = str(params.get("mode") or "zscore")
        if mode == "zscore":
            mean = x.mean(dim=axis, keepdim=True)
            std = x.std(dim=axis, unbiased=False, keepdim=True)
            out, stats = (x - mean) / safe(std), {"mean": mean.squeeze().tolist(),
                                                 "std": std.squeeze().tolist()}
        elif mode == "minmax":
            mn = x.min(dim=axis, keepdim=True).values
            mx = x.max(dim=axis, keepdim=True).values
            out, stats = (x - mn) / safe(mx - mn), {"min": mn.squeeze().tolist(),
                                                   "max": mx.squeeze().tolist()}
        elif mode == "unit_norm":
            norms = x.norm(dim=axis, keepdim=True)
            out, stats = x / safe(norms), {"norm": norms.squeeze().tolist()}
        else:
            raise ValueError(f"Normalize: unknown mode {mode!r}; use zscore, minmax or unit_norm")
        return {"tensor": out, "stats": stats}


def _apply_stats(x: Any, stats: Any, axis: int) -> Any:
    """Normalise ``x`` with statistics fitted by another Normalize (no refit)."""
    import torch

    if not isinstance(stats, dict):
        raise ValueError(f"Normalize: the `stats` input must be the stats dict of another "
                         f"Normalize, got {type(stats).__name__}")
    shape = list(x.shape)
    shape[axis] = 1
    expected = math.prod(shape)

    def stat(key: str) -> Any:
        t = torch.as_tensor(stats[key], dtype=torch.float32)
        if t.numel() != expected:
            raise ValueError(f"Normalize: stats[{key!r}] has {t.numel()} value(s), but a tensor of "
                             f"shape {tuple(x.shape)} along axis={axis} needs {expected}; wire stats "
                             f"fitted on data with the same columns and use the same axis")
        return t.reshape(shape)

    def safe(t: Any) -> Any:
        return torch.where(t == 0, torch.ones_like(t), t)

    if "mean" in stats and "std" in stats:
        return (x - stat("mean")) / safe(stat("std"))
    if "min" in stats and "max" in stats:
        mn = stat("min")
        return (x - mn) / safe(stat("max") - mn)
    if "norm" in stats:
        return x / safe(stat("norm"))
    raise ValueError(f"Normalize: the `stats` input has keys {sorted(stats)}; expected "
                     f"mean/std, min/max or norm from another Normalize")


class TrainTestSplitNode(Node):
    NODE_NAME = "TrainTestSplit"
    CATEGORY = "Data"
    DESCRIPTION = "Split (features, labels) into train and test sets"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [
            Port("features", TENSOR, "Feature tensor [N, F]."),
            Port("labels", LIST, "Per-sample labels (LIST or LongTensor)."),
        ]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("x_train", TENSOR, "Training features."),
            Port("y_train", LIST, "Training labels."),
            Port("x_test", TENSOR, "Test features."),
            Port("y_test", LIST, "Test labels."),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("test_size", "float", 0.2, "Fraction of samples reserved for testing. Must be in (0, 1).",
                  min_value=0.0, max_value=1.0),
            Param("seed", "int", 42, "Seed for reproducible shuffling."),
            Param("stratify", "bool", False, "Preserve per-class proportions in both partitions."),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        features = as_tensor(inputs.get("features"), "features").detach().cpu()
        if inputs.get("labels") is None:
            raise ValueError("TrainTestSplit requires both `features` and `labels` inputs")
        labels = as_list(inputs["labels"])
        if features.shape[0] != len(labels):
            raise ValueError(f"TrainTestSplit: features and labels length mismatch: "
                             f"{features.shape[0]} rows vs {len(labels)} labels")
        test_size = float(params.get("test_size", 0.2))
        if not 0 < test_size < 1:
            raise ValueError(f"TrainTestSplit: test_size must be in (0, 1), got {test_size}")
        seed = int(params.get("seed", 42))
        if as_bool(params.get("stratify"), False):
            train, test = skc.stratified_shuffle_split(labels, test_size, seed)
        else:
            train, test = skc.shuffle_split(len(labels), test_size, seed)
        tr, te = torch.tensor(train, dtype=torch.long), torch.tensor(test, dtype=torch.long)
        return {
            "x_train": features[tr].float(),
            "y_train": [labels[i] for i in train],
            "x_test": features[te].float(),
            "y_test": [labels[i] for i in test],
        }


class TensorCreateNode(Node):
    NODE_NAME = "TensorCreate"
    CATEGORY = "Tensor Operations"
    DESCRIPTION = "Tensor of a given shape: zeros, ones, random, constant"

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Created tensor")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("shape", "string", "1,3,224,224", "Tensor shape as comma-separated ints (e.g. '1,3,224,224')"),
            Param("fill", "select", "zeros", "Fill method",
                  options=["zeros", "ones", "randn", "rand", "full", "arange"]),
            Param("value", "float", 0.0, "Fill value (for 'full' mode)"),
            Param("requires_grad", "bool", False, "Whether the tensor requires gradient"),
        ]

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[tuple[str, str]]:
        return shape_problem("shape", params.get("shape", "1,3,224,224"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        import torch

        shape = parse_shape(params.get("shape", "1,3,224,224"))
        fill = str(params.get("fill") or "zeros")
        value = float(params.get("value", 0.0) or 0.0)
        creators = {
            "zeros": lambda: torch.zeros(*shape),
            "ones": lambda: torch.ones(*shape),
            "randn": lambda: torch.randn(*shape),
            "rand": lambda: torch.rand(*shape),
            "full": lambda: torch.full(shape, value),
            # CodefyUI: arange uses only the first entry of shape, 1-D float.
            "arange": lambda: torch.arange(shape[0]).float(),
        }
        if fill not in creators:
            raise ValueError(f"TensorCreate: unsupported fill {fill!r}; use one of {sorted(creators)}")
        tensor = creators[fill]()
        if as_bool(params.get("requires_grad"), False):
            tensor.requires_grad_(True)
        return {"tensor": tensor}


class MeanNode(Node):
    NODE_NAME = "Mean"
    CATEGORY = "Tensor Operations"
    DESCRIPTION = "Compute mean of tensor along specified dimension(s)"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Input tensor")]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR, "Reduced tensor")]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("dim", "string", "-1", "Dimension(s) to reduce as comma-separated ints (e.g. '-1' or '2,3')"),
            Param("keepdim", "bool", False, "Whether to keep the reduced dimension"),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        x = as_tensor(inputs.get("tensor"), "tensor")
        dims = parse_int_list(params.get("dim", "-1"), "dim")
        if not dims:
            raise ValueError("Mean: dim must name at least one dimension, e.g. '-1' or '0'")
        keepdim = as_bool(params.get("keepdim"), False)
        if not x.is_floating_point():
            x = x.float()
        return {"tensor": x.mean(dim=dims[0] if len(dims) == 1 else dims, keepdim=keepdim)}
