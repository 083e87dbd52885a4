"""Where cdui's nodes behaved otherwise than CodefyUI's own unit tests say
(``backend/tests/test_*_node.py`` in CodefyUI's public repository), each a
table of small cases: the kernel forms Conv2dExplicit takes, Add on integer
tensors, Transform on a Pillow image, Split's ports, a refused empty
``hidden_sizes``, TextInput's missing value, and the exception *type* a node
raises (a bad param or path is a ``ValueError``; a shape torch refuses stays
torch's ``RuntimeError``; a missing folder is a ``FileNotFoundError``), since
code calling a node tells errors apart by it.

Nodes run through the real registry; graphs through the real validator.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as functional

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.graph.executor import Executor
from cdui.graph.validate import validate_graph
from cdui.nodes.registry import Registry, build_registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    return build_registry()


@pytest.fixture
def ctx(tmp_path: Path) -> RunContext:
    (tmp_path / "data").mkdir()
    return RunContext("run-1", Layout.for_data_dir(tmp_path / "data"), emit=lambda kind, data: None)


def execute(registry: Registry, type_name: str, ctx: RunContext, inputs: dict[str, Any] | None = None,
            **params: Any) -> dict[str, Any]:
    """``execute`` with exactly these params, as CodefyUI's tests call a node."""
    cls = registry.get(type_name)
    assert cls is not None, type_name
    return cls().execute(inputs or {}, params, ctx)


def graph(nodes: list[tuple[str, str, dict[str, Any]]], edges: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    """Start triggering the first node, then ``nodes`` joined by ``edges``."""
    return {"nodes": [{"id": "start", "type": "Start", "data": {"params": {}}}]
            + [{"id": i, "type": t, "data": {"params": p}} for i, t, p in nodes],
            "edges": [{"source": "start", "sourceHandle": "trigger", "target": nodes[0][0], "type": "trigger"}]
            + [{"source": s, "sourceHandle": sh, "target": t, "targetHandle": th} for s, sh, t, th in edges]}


# -- Add: integer tensors keep their dtype ---------------------------------------------------------
@pytest.mark.parametrize(("dtype", "alpha", "want"), [
    (torch.int32, 1.0, [5, 7, 9]),    # validation makes an int alpha a float: 1 -> 1.0
    (torch.int64, 2.0, [9, 12, 15]),
    (torch.int64, -1.0, [-3, -3, -3]),
    (torch.float64, 0.5, [3.0, 4.5, 6.0]),
])
def test_add_takes_integer_tensors_with_a_whole_alpha(registry: Registry, ctx: RunContext, dtype: torch.dtype,
                                                      alpha: float, want: list[float]) -> None:
    a, b = torch.tensor([1, 2, 3], dtype=dtype), torch.tensor([4, 5, 6], dtype=dtype)
    out = execute(registry, "Add", ctx, {"tensor_a": a, "tensor_b": b}, alpha=alpha)["tensor"]
    assert out.dtype == dtype and out.tolist() == want


def test_add_refuses_a_fractional_alpha_for_integer_tensors(registry: Registry, ctx: RunContext) -> None:
    ints = {"tensor_a": torch.tensor([1, 2]), "tensor_b": torch.tensor([3, 4])}
    with pytest.raises(ValueError, match=r"alpha=0.5 is not a whole number.*use a whole alpha or float tensors"):
        execute(registry, "Add", ctx, ints, alpha=0.5)


# -- Conv2dExplicit: CodefyUI's kernel forms, and tensors only -------------------------------------
LAPLACIAN = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]])
IDENTITY = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def _depthwise(x: torch.Tensor, per_channel: list[torch.Tensor]) -> torch.Tensor:
    return functional.conv2d(x, torch.stack(per_channel).unsqueeze(1), padding=1, groups=x.shape[1])


X2 = torch.arange(50, dtype=torch.float32).reshape(1, 2, 5, 5)


@pytest.mark.parametrize(("kernel", "want"), [
    (LAPLACIAN, _depthwise(X2, [LAPLACIAN, LAPLACIAN])),
    (LAPLACIAN.reshape(1, 1, 3, 3), _depthwise(X2, [LAPLACIAN, LAPLACIAN])),       # broadcast to every channel
    (torch.stack([IDENTITY, torch.zeros(3, 3)]).reshape(2, 1, 3, 3),              # one kernel per channel
     _depthwise(X2, [IDENTITY, torch.zeros(3, 3)])),
    (torch.stack([IDENTITY, LAPLACIAN]), _depthwise(X2, [IDENTITY, LAPLACIAN])),  # (C, k, k): cdui's too
], ids=["(k,k)", "(1,1,k,k)", "(C,1,k,k)", "(C,k,k)"])
def test_conv2d_explicit_takes_codefyuis_kernel_forms(registry: Registry, ctx: RunContext, kernel: torch.Tensor,
                                                      want: torch.Tensor) -> None:
    out = execute(registry, "Conv2dExplicit", ctx, {"tensor": X2, "kernel": kernel}, stride=1, padding=1)["tensor"]
    assert torch.equal(out, want)


def test_conv2d_explicit_keeps_float64(registry: Registry, ctx: RunContext) -> None:
    x = torch.ones(1, 1, 5, 5, dtype=torch.float64)
    assert execute(registry, "Conv2dExplicit", ctx, {"tensor": x, "kernel": torch.ones(3, 3)},
                   padding=1)["tensor"].dtype == torch.float64


@pytest.mark.parametrize(("x", "kernel", "message"), [
    (torch.zeros(1, 3, 5, 5), torch.zeros(2, 1, 3, 3), r"out-channel must be 1 or C=3"),
    (torch.zeros(1, 3, 5, 5), torch.zeros(1, 3, 3, 3), r"inner channel must be 1"),
    (torch.zeros(1, 1, 5, 5), torch.zeros(3, 3, 3), r"3D kernel must be \(C=1, k, k\)"),
    (torch.zeros(1, 1, 5, 5), torch.zeros(2, 3), r"must be square"),
    (torch.zeros(1, 1, 5, 5), torch.zeros(3), r"must be 2D \(k, k\) or 4D"),
    (torch.zeros(1, 5, 5), torch.zeros(3, 3), r"must be 4D \(N, C, H, W\).*Unsqueeze"),
    ([[1.0, 2.0], [3.0, 4.0]], torch.zeros(3, 3), r"`tensor` input must be a torch.Tensor, got list"),
    (torch.zeros(1, 1, 5, 5), [[1.0, 0.0], [0.0, 1.0]], r"`kernel` input must be a torch.Tensor, got list"),
], ids=["out-channels", "inner-channel", "3d-mismatch", "not-square", "1d", "3d-input", "list-input",
        "list-kernel"])
def test_conv2d_explicit_refuses_with_a_value_error(registry: Registry, ctx: RunContext, x: Any, kernel: Any,
                                                    message: str) -> None:
    with pytest.raises(ValueError, match=message):
        execute(registry, "Conv2dExplicit", ctx, {"tensor": x, "kernel": kernel}, padding=1)


# -- Transform: a Pillow image, as torchvision's datasets hand over --------------------------------
class _Dataset:
    transform: Any = None


@pytest.mark.parametrize(("mode", "resize", "shape"), [
    ("RGB", 32, (3, 32, 32)), ("L", 0, (1, 100, 60)), ("RGBA", 8, (4, 8, 8)), ("1", 0, (1, 100, 60)),
])
def test_transform_takes_a_pil_image(registry: Registry, ctx: RunContext, mode: str, resize: int,
                                     shape: tuple[int, ...]) -> None:
    from PIL import Image

    image = Image.new(mode, (60, 100), 1 if mode == "1" else (200 if mode == "L" else (200,) * len(mode)))
    ds = _Dataset()
    execute(registry, "Transform", ctx, {"dataset": ds}, resize=resize, normalize=True, to_tensor=True)
    out = ds.transform(image)
    assert out.dtype == torch.float32 and tuple(out.shape) == shape
    # Pillow's resize, ToTensor (/255), then Normalize(0.5, 0.5): a flat image stays flat.
    level = 255 if mode == "1" else 200
    assert torch.allclose(out, torch.full(shape, (level / 255 - 0.5) / 0.5))


def test_transform_resizes_a_pil_image_with_pillow_as_torchvision_does(registry: Registry, ctx: RunContext) -> None:
    from PIL import Image

    image = Image.frombytes("L", (4, 2), bytes([0, 50, 100, 150, 200, 250, 10, 20]))
    ds = _Dataset()
    execute(registry, "Transform", ctx, {"dataset": ds}, resize=3, normalize=False, to_tensor=False)
    want = list(image.resize((3, 3), Image.Resampling.BILINEAR).tobytes())
    got = ds.transform(image)
    assert got.dtype == torch.uint8 and got.flatten().tolist() == want


# -- Split: only the pieces its chunks make --------------------------------------------------------
@pytest.mark.parametrize(("chunks", "port", "errors"), [
    (1, "chunk_0", []),
    (1, "chunk_1", [("bad_port", "chunk_1", "outputs are ['chunk_0']")]),  # listed in the catalog, yet absent
    (2, "chunk_1", []),
    (3, "chunk_2", []),
    (3, "chunk_3", [("bad_port", "chunk_3", "outputs are ['chunk_0', 'chunk_1', 'chunk_2']")]),
])
def test_split_ports_are_the_pieces_its_chunks_make(registry: Registry, chunks: int, port: str,
                                                    errors: list[tuple[str, str, str]]) -> None:
    g = graph([("src", "TensorCreate", {"shape": "6"}), ("split", "Split", {"chunks": chunks}), ("p", "Print", {})],
              [("src", "tensor", "split", "tensor"), ("split", port, "p", "value")])
    _plan, got = validate_graph(g, registry)
    assert [(e["code"], e["value"], e["hint"]) for e in got] == errors


# -- MLPClassifier: no hidden layer is refused, not replaced ----------------------------------------
@pytest.mark.parametrize("sizes", ["", " , ", "16,0"])
def test_mlp_classifier_refuses_hidden_sizes_without_a_layer(registry: Registry, ctx: RunContext, sizes: str) -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="hidden_sizes needs at least one layer"):
        execute(registry, "MLPClassifier", ctx, {"x_train": x, "y_train": ["a", "b", "a", "b"], "x_query": x},
                hidden_sizes=sizes, max_iter=5)


# -- TextInput: a value the graph leaves out is "" -------------------------------------------------
@pytest.mark.parametrize(("params", "text"), [({}, ""), ({"value": ""}, ""), ({"value": "hello"}, "hello"),
                                              ({"value": 42}, "42")])
def test_text_input_runs_with_what_the_graph_gives(registry: Registry, tmp_path: Path, params: dict[str, Any],
                                                   text: str) -> None:
    plan, errors = validate_graph(graph([("t", "TextInput", params)], []), registry)
    assert errors == [] and plan is not None
    ctx = RunContext("run-1", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)
    assert Executor(registry, ctx).run(plan)["t"] == {"text": text}


def test_text_input_still_offers_its_sample_to_a_new_node(registry: Registry) -> None:
    cls = registry.get("TextInput")
    assert cls is not None
    assert cls.describe()["params"][0]["default"] == "The quick brown fox jumps over the lazy dog."


# -- the exception a node raises -------------------------------------------------------------------
REFUSALS: list[tuple[str, str, dict[str, Any], dict[str, Any], type[Exception], str]] = [
    # shapes torch refuses: torch's RuntimeError, as in CodefyUI, with the shapes in words
    ("Concat", "other dims differ", {"tensor_a": torch.zeros(2, 3), "tensor_b": torch.zeros(2, 4)}, {"dim": 0},
     RuntimeError, r"cannot join \(2, 3\) and \(2, 4\) along dim 0"),
    ("MatMul", "inner dims differ", {"tensor_a": torch.zeros(3, 4), "tensor_b": torch.zeros(5, 6)}, {},
     RuntimeError, r"shapes \(3, 4\) and \(5, 6\) cannot be multiplied"),
    ("MoELayer", "width is not hidden_dim", {"x": torch.zeros(1, 2, 16)},
     {"num_experts": 4, "top_k": 2, "hidden_dim": 8, "expert_hidden_dim": 16, "seed": 42},
     RuntimeError, r"does not fit hidden_dim=8; set hidden_dim to 16"),
    ("RewardModel", "width is not input_dim", {"hidden_states": torch.zeros(2, 16)},
     {"input_dim": 8, "hidden_dim": 16, "seed": 42}, RuntimeError, r"do not fit input_dim=8; set input_dim to 16"),
    # a folder that is not there
    ("ImageBatchReader", "missing folder", {}, {"directory": "no_such_folder"}, FileNotFoundError,
     r"directory not found: 'no_such_folder'"),
    # a path param outside the data folders: a ValueError, as CodefyUI's path checks raise
    ("ImageBatchReader", "folder outside", {}, {"directory": "../elsewhere"}, ValueError, r"'\.\.' is not allowed"),
    ("FileReader", "file outside", {}, {"path": "../secret.txt"}, ValueError, r"'\.\.' is not allowed"),
    # CodefyUI's words for a missing param, which its tests match on
    ("ImageBatchReader", "no directory", {}, {"directory": ""}, ValueError, r"Directory is required"),
    ("Map", "no preset named", {"items": [1]}, {"subgraph": ""}, ValueError, r"subgraph parameter is required"),
    # a preset Map cannot find
    ("Map", "unknown preset", {"items": [1, 2]}, {"subgraph": "definitely_not_a_real_preset"}, ValueError,
     r"preset 'definitely_not_a_real_preset' was not found"),
    # items that are not numbers
    ("Reduce", "strings summed", {"items": ["not", "numbers"]}, {"operation": "sum"}, ValueError,
     r"sum needs numeric items \(numbers or tensors\), but item 0 is str 'not'"),
    ("Reduce", "nested strings", {"items": [[1.0], ["x"]]}, {"operation": "mean"}, ValueError,
     r"mean needs numeric items"),
]


@pytest.mark.parametrize(("type_name", "inputs", "params", "exc", "message"), [r[:1] + r[2:] for r in REFUSALS],
                         ids=[f"{r[0]}: {r[1]}" for r in REFUSALS])
def test_the_exception_a_node_raises(registry: Registry, ctx: RunContext, type_name: str, inputs: dict[str, Any],
                                     params: dict[str, Any], exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=message) as raised:
        execute(registry, type_name, ctx, inputs, **params)
    # A shape torch refuses is not also a ValueError (code that tells the two apart keeps working).
    assert isinstance(raised.value, ValueError) == (exc is ValueError)


def test_map_in_a_run_names_the_preset_it_cannot_find(registry: Registry, tmp_path: Path) -> None:
    """Inside a run, the executor's preset runner raises the same ValueError (validation refuses the
    graph first; a preset that vanished between the two is reported the same way)."""
    g = graph([("v", "SyntheticDataset", {}), ("m", "Map", {"subgraph": "gone"})],
              [("v", "labels", "m", "items")])
    g["presets"] = [{"preset_name": "gone", "nodes": [], "edges": []}]
    plan, errors = validate_graph(g, registry)
    assert errors == [] and plan is not None
    del plan.presets["gone"]
    ctx = RunContext("run-1", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)
    with pytest.raises(Exception, match=r"ValueError: Map: preset 'gone' was not found"):
        Executor(registry, ctx).run(plan)
