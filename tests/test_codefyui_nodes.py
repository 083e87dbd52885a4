"""CodefyUI's built-in node types in cdui: the same interface and the same
computation, so graphs exported from CodefyUI validate and run unchanged.

``tests/data/codefyui_node_interfaces.json`` holds the interface facts of
CodefyUI 1.4.2's 110 built-in types (type, category, ports, params with their
defaults, ranges and options), read from its public source. The parity test
compares every type cdui registers under a CodefyUI name against it; the
table tests run each node on small tensors with known results, checked
against torch itself.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as functional

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.graph.validate import validate_graph
from cdui.nodes.base import Node
from cdui.nodes.builtin import classical_sklearn, cnn, fileio, layers, plots, sequence, tensor_ops
from cdui.nodes.registry import Registry, build_registry

INTERFACES = {n["type"]: n for n in json.loads(
    (Path(__file__).parent / "data" / "codefyui_node_interfaces.json").read_text(encoding="utf-8"))}

# The types cdui runs today; the parity test fails if one disappears (and the
# list grows as the rest of the catalog lands: docs/graphs-and-nodes.md).
IMPLEMENTED = {
    # tensor operations and utility
    "Add", "Argmax", "MatMul", "Mean", "Multiply", "Permute", "ScalarMultiply", "Softmax", "Split",
    "Squeeze", "Stack", "TensorCreate", "Unsqueeze", "Concat", "Reshape", "Embedding", "Flatten",
    "Linear", "Print",
    # CNN and normalization
    "Activation", "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm2d", "Conv1d", "Conv2d", "Conv2dExplicit",
    "Conv2dKernel", "ConvTranspose2d", "Dropout", "MaxPool2d", "BatchNorm1d", "GroupNorm",
    "InstanceNorm2d", "LayerNorm",
    # RNN and transformer
    "GRU", "LSTM", "RNNCell", "MoELayer", "MultiHeadAttention", "TransformerDecoder", "TransformerEncoder",
    # data, classical, IO, training, control
    "CSVReader", "ColumnSelector", "DataLoader", "Normalize", "TrainTestSplit", "Map", "KNN", "Accuracy",
    "CheckpointLoader", "CheckpointSaver", "FileReader", "ImageReader", "ImageWriter", "Inference",
    "ModelLoader", "ModelSaver", "Loss", "Optimizer", "SequentialModel", "TrainingLoop", "Start",
    "Dataset", "DatasetBatch", "GraphInput", "GraphOutput",
    # the classical and plots extras
    "DecisionTreeClassifier", "LinearRegression", "LogisticRegression", "MLPClassifier", "RandomForestClassifier",
    "SVMClassifier", "SyntheticDataset", "Visualize", "ScatterPlot2D", "DecisionBoundary",
    # diffusion, RLHF, LLM blocks, data flow and inputs (tests/test_codefyui_nodes_more.py)
    "GaussianNoise", "Lerp", "TimestepEmbedding", "Upsample", "DiffusionUNet", "DDPMSampler",
    "KLDivergence", "RewardModel", "CosineSimilarity", "AttentionMask", "PositionalEncoding",
    "Switch", "Reduce", "TextInput", "TensorInput", "RowSelector", "BackwardOnce",
    # reinforcement learning (EnvWrapper with the rl extra)
    "DQN", "PPO", "EnvWrapper",
    # training extras beside TrainingLoop
    "LRScheduler", "EvaluateModel",
    # generated images, image pipelines, diffusion training, LLM and local-cache datasets
    # (tests/test_codefyui_nodes_rest.py)
    "SyntheticSegmentation", "SyntheticShapes", "Transform", "ImageBatchReader", "DiffusionTrainingLoop",
    "AttentionHeatmap", "Tokenizer", "LLMChat", "KaggleDataset", "HuggingFaceDataset",
    # word vectors (tests/test_codefyui_word_vectors.py)
    "WordVector", "EmbeddingScatter",
}

# Select options later CodefyUI versions added and their exported graphs use, which
# cdui accepts beside 1.4.2's (each is listed in docs/graphs-and-nodes.md): the
# interface test expects exactly 1.4.2's options followed by these.
NEWER_OPTIONS: dict[tuple[str, str], list[str]] = {
    ("EvaluateModel", "device"): ["auto"],  # the stored TrainCNN-MNIST example sets it
}
# Inputs 1.4.2 requires that cdui takes as optional, because later versions replaced them with params cdui
# also has (docs/graphs-and-nodes.md): Conv2dExplicit's kernel, picked by its preset/kernel_size/weights there.
NEWER_OPTIONAL: set[tuple[str, str]] = {("Conv2dExplicit", "kernel")}
# cdui's file-semantics param types refine CodefyUI's plain "string" (docs/graphs-and-nodes.md, Paths).
FILE_TYPES = {"data_file", "image_file", "model_file", "path", "folder", "output_path"}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return build_registry()


@pytest.fixture
def ctx(tmp_path: Path) -> RunContext:
    return RunContext("run-1", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)


def run(node_cls: type[Node], ctx: RunContext, inputs: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    merged = {p.name: p.default for p in node_cls.define_params()}
    merged.update(params)
    return node_cls().execute(inputs or {}, merged, ctx)


# -- the interface ------------------------------------------------------------------
def _port_list(ports: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [(p["name"], p["type"], bool(p.get("optional", False))) for p in ports]


def _param_facts(p: dict[str, Any]) -> dict[str, Any]:
    return {k: p[k] for k in ("default", "min", "max", "options", "visible_when") if k in p and p[k] not in (None, [])}


def test_the_vendored_catalog_is_codefyuis_110_types() -> None:
    assert len(INTERFACES) == 110


@pytest.mark.parametrize("type_name", sorted(IMPLEMENTED))
def test_interface_matches_codefyui(registry: Registry, type_name: str) -> None:
    """CodefyUI's category, ports and params, unchanged: its inputs (names,
    types, optional) in its order, its outputs, and its params with the same
    types, defaults, ranges and options. cdui may add optional inputs, extra
    outputs and params of its own (each with a default, so CodefyUI's graphs
    still validate), and a file param's plain "string" is one of cdui's file
    types."""
    cls = registry.get(type_name)
    assert cls is not None, f"{type_name} is not registered"
    want, have = INTERFACES[type_name], cls.describe()
    assert have["category"] == want["category"]
    want_in, have_in = _port_list(want["inputs"]), _port_list(have["inputs"])
    want_in = [(n, t, opt or (type_name, n) in NEWER_OPTIONAL) for n, t, opt in want_in]
    assert have_in[:len(want_in)] == want_in
    assert all(optional for _name, _type, optional in have_in[len(want_in):])
    have_out = {name: t for name, t, _ in _port_list(have["outputs"])}
    for name, t, _ in _port_list(want["outputs"]):
        assert have_out.get(name) in (t, "ANY"), (name, have_out.get(name), t)
    have_params = {p["name"]: p for p in have["params"]}
    for p in want["params"]:
        mine = have_params.get(p["name"])
        assert mine is not None, f"param {p['name']!r} is missing"
        assert mine["type"] == p["type"] or (p["type"] == "string" and mine["type"] in FILE_TYPES), p["name"]
        want_facts = _param_facts(p)
        if (type_name, p["name"]) in NEWER_OPTIONS:
            want_facts["options"] = want_facts["options"] + NEWER_OPTIONS[(type_name, p["name"])]
        assert _param_facts(mine) == want_facts, p["name"]


# -- what each node computes ------------------------------------------------------------
A = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
B = torch.tensor([[10.0, 20.0], [30.0, 40.0]])


@pytest.mark.parametrize(("cls", "inputs", "params", "expected"), [
    (tensor_ops.AddNode, {"tensor_a": A, "tensor_b": B}, {"alpha": 0.5}, A + 0.5 * B),
    (tensor_ops.MultiplyNode, {"tensor_a": A, "tensor_b": B}, {}, A * B),
    (tensor_ops.MatMulNode, {"tensor_a": A, "tensor_b": B}, {}, A @ B),
    (tensor_ops.ScalarMultiplyNode, {"tensor": A}, {"scalar": -2.0}, -2 * A),
    (tensor_ops.ArgmaxNode, {"tensor": torch.tensor([[1.0, 9.0, 3.0], [7.0, 0.0, 2.0]])}, {},
     torch.tensor([1, 0])),
    (tensor_ops.ArgmaxNode, {"tensor": torch.tensor([[1.0, 9.0], [7.0, 0.0]])}, {"dim": 0, "keepdim": True},
     torch.tensor([[1, 0]])),
    (tensor_ops.SoftmaxNode, {"tensor": A}, {"dim": 0}, torch.softmax(A, dim=0)),
    (tensor_ops.PermuteNode, {"tensor": torch.arange(24).reshape(2, 3, 4)}, {},
     torch.arange(24).reshape(2, 3, 4).permute(0, 2, 1)),
    (tensor_ops.UnsqueezeNode, {"tensor": A}, {"dim": 1}, A.unsqueeze(1)),
    (tensor_ops.StackNode, {"tensor_a": A, "tensor_b": B}, {"dim": 1}, torch.stack([A, B], dim=1)),
    (tensor_ops.ConcatNode, {"tensor_a": A, "tensor_b": B}, {"dim": 1}, torch.cat([A, B], dim=1)),
    (tensor_ops.ReshapeNode, {"tensor": torch.arange(8)}, {"shape": "-1,4"}, torch.arange(8).reshape(2, 4)),
])
def test_tensor_operations(ctx: RunContext, cls: type[Node], inputs: dict[str, Any], params: dict[str, Any],
                           expected: torch.Tensor) -> None:
    assert torch.equal(run(cls, ctx, inputs, **params)["tensor"], expected)


def test_squeeze_minus_one_removes_every_size_one_dim_as_codefyui_does(ctx: RunContext) -> None:
    x = torch.zeros(1, 3, 1, 2, 1)
    assert run(tensor_ops.SqueezeNode, ctx, {"tensor": x})["tensor"].shape == (3, 2)
    assert run(tensor_ops.SqueezeNode, ctx, {"tensor": x}, dim=2)["tensor"].shape == (1, 3, 2, 1)


def test_split_emits_numbered_pieces(ctx: RunContext) -> None:
    out = run(tensor_ops.SplitNode, ctx, {"tensor": torch.arange(9)}, chunks=3)
    assert sorted(out) == ["chunk_0", "chunk_1", "chunk_2"]
    assert [out[f"chunk_{i}"].tolist() for i in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize(("cls", "params", "message"), [
    (tensor_ops.PermuteNode, {"dims": "0,0,1"}, "is not an order of the input's 3 dimensions"),
    (tensor_ops.ReshapeNode, {"shape": "5,5"}, "cannot take the shape '5,5'"),
])
def test_shape_mistakes_say_what_fits(ctx: RunContext, cls: type[Node], params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run(cls, ctx, {"tensor": torch.zeros(2, 3, 4)}, **params)


def test_conv_pool_and_norm_shapes_and_values(ctx: RunContext) -> None:
    x = torch.randn(2, 1, 8, 8)
    y = run(cnn.Conv2dNode, ctx, {"tensor": x})["tensor"]
    assert y.shape == (2, 32, 8, 8)
    assert run(cnn.Conv1dNode, ctx, {"tensor": torch.randn(2, 1, 10)})["tensor"].shape == (2, 32, 10)
    assert run(cnn.ConvTranspose2dNode, ctx, {"tensor": torch.randn(1, 64, 4, 4)})["tensor"].shape == (1, 32, 8, 8)
    assert torch.equal(run(cnn.MaxPool2dNode, ctx, {"tensor": x})["tensor"], functional.max_pool2d(x, 2, 2))
    assert torch.allclose(run(cnn.AvgPool2dNode, ctx, {"tensor": x})["tensor"], functional.avg_pool2d(x, 2, 2))
    assert torch.allclose(run(cnn.AdaptiveAvgPool2dNode, ctx, {"tensor": x})["tensor"],
                          x.mean(dim=(2, 3), keepdim=True))
    # Batch statistics (training mode, as in CodefyUI): each channel comes out with mean 0.
    bn = run(cnn.BatchNorm2dNode, ctx, {"tensor": torch.randn(4, 32, 3, 3) * 5 + 2})["tensor"]
    assert torch.allclose(bn.mean(dim=(0, 2, 3)), torch.zeros(32), atol=1e-5)
    bn1 = run(cnn.BatchNorm1dNode, ctx, {"tensor": torch.randn(16, 128) + 3})["tensor"]
    assert torch.allclose(bn1.mean(dim=0), torch.zeros(128), atol=1e-5)
    ln = run(cnn.LayerNormNode, ctx, {"tensor": torch.randn(3, 512) * 4})["tensor"]
    assert torch.allclose(ln, functional.layer_norm(ln.new_tensor(ln), [512]), atol=1e-4)
    g = torch.randn(2, 256, 2, 2)
    assert torch.allclose(run(cnn.GroupNormNode, ctx, {"tensor": g})["tensor"], functional.group_norm(g, 32),
                          atol=1e-5)
    i = torch.randn(2, 64, 4, 4)
    assert torch.allclose(run(cnn.InstanceNorm2dNode, ctx, {"tensor": i})["tensor"],
                          functional.instance_norm(i), atol=1e-5)


def test_conv2d_on_the_wrong_channels_says_what_it_expects(ctx: RunContext) -> None:
    with pytest.raises(ValueError, match=r"expects \(N, 1, H, W\)"):
        run(cnn.Conv2dNode, ctx, {"tensor": torch.randn(2, 3, 8, 8)})


def test_dropout_always_drops_as_in_codefyui(ctx: RunContext) -> None:
    y = run(cnn.DropoutNode, ctx, {"tensor": torch.ones(1000)}, p=0.5)["tensor"]
    assert set(y.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(run(cnn.DropoutNode, ctx, {"tensor": torch.ones(10)}, p=0.0)["tensor"], torch.ones(10))


def test_kernels_and_explicit_convolution(ctx: RunContext) -> None:
    edge = run(cnn.Conv2dKernelNode, ctx)["tensor"]
    assert edge.tolist() == [[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]]
    custom = run(cnn.Conv2dKernelNode, ctx, preset="Custom", kernel_size=2, weights=[[1, 2], [3, 4]])["tensor"]
    assert custom.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(ValueError, match="weights holds 9 numbers but kernel_size=2 needs 4"):
        run(cnn.Conv2dKernelNode, ctx, preset="Custom", kernel_size=2)
    # A constant image has no edges: the Laplacian gives 0 inside, on every channel.
    img = torch.ones(1, 3, 5, 5)
    out = run(cnn.Conv2dExplicitNode, ctx, {"tensor": img, "kernel": edge}, padding=0)["tensor"]
    assert out.shape == (1, 3, 3, 3) and torch.equal(out, torch.zeros(1, 3, 3, 3))
    x = torch.randn(1, 2, 6, 6)
    ref = functional.conv2d(x, edge.reshape(1, 1, 3, 3).expand(2, 1, 3, 3), padding=1, groups=2)
    assert torch.allclose(run(cnn.Conv2dExplicitNode, ctx, {"tensor": x, "kernel": edge})["tensor"], ref)
    # Nothing wired into `kernel`: the node's own preset (later CodefyUI versions, its packs' examples).
    assert torch.allclose(run(cnn.Conv2dExplicitNode, ctx, {"tensor": x})["tensor"], ref)
    sharpen = torch.tensor(cnn.KERNELS_3X3["Sharpen3x3"])
    ref = functional.conv2d(x, sharpen.reshape(1, 1, 3, 3).expand(2, 1, 3, 3), padding=1, groups=2)
    assert torch.allclose(run(cnn.Conv2dExplicitNode, ctx, {"tensor": x}, preset="Sharpen3x3")["tensor"], ref)
    ref = functional.conv2d(x, torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2).expand(2, 1, 2, 2),
                            padding=0, groups=2)
    got = run(cnn.Conv2dExplicitNode, ctx, {"tensor": x}, preset="Custom", kernel_size=2, weights=[[1, 2], [3, 4]],
              padding=0)["tensor"]
    assert torch.allclose(got, ref)
    # A wired kernel wins over the preset.
    ones = torch.ones(3, 3)
    ref = functional.conv2d(x, ones.reshape(1, 1, 3, 3).expand(2, 1, 3, 3), padding=1, groups=2)
    assert torch.allclose(run(cnn.Conv2dExplicitNode, ctx, {"tensor": x, "kernel": ones}, preset="Sharpen3x3")
                          ["tensor"], ref)
    with pytest.raises(ValueError, match="Conv2dExplicit: weights holds 9 numbers but kernel_size=2 needs 4"):
        run(cnn.Conv2dExplicitNode, ctx, {"tensor": x}, preset="Custom", kernel_size=2)


def test_recurrent_layers(ctx: RunContext) -> None:
    x = torch.randn(2, 5, 128)
    out = run(sequence.LSTMNode, ctx, {"tensor": x})
    assert out["output"].shape == (2, 5, 256) and out["hidden"].shape == (1, 2, 256)
    # h_n is the last step's output for a one-layer, one-direction LSTM.
    assert torch.allclose(out["hidden"][0], out["output"][:, -1])
    gru = run(sequence.GRUNode, ctx, {"tensor": x}, bidirectional=True)
    assert gru["output"].shape == (2, 5, 512) and gru["hidden"].shape == (2, 2, 256)


def test_rnn_cell_is_seeded_and_starts_from_zeros(ctx: RunContext) -> None:
    x = torch.randn(3, 8)
    a = run(sequence.RNNCellNode, ctx, {"tensor": x})["hidden"]
    b = run(sequence.RNNCellNode, ctx, {"tensor": x})["hidden"]
    assert a.shape == (3, 16) and torch.equal(a, b)
    cell = sequence.seeded_rnn_cell(8, 16, "tanh", 42)
    assert torch.equal(cell.bias_ih, torch.zeros(16))
    assert torch.allclose(a, torch.tanh(x @ cell.weight_ih.T))
    assert not torch.equal(a, run(sequence.RNNCellNode, ctx, {"tensor": x}, seed=7)["hidden"])


def test_attention_and_transformer_stacks_are_sequence_first(ctx: RunContext) -> None:
    q = torch.randn(4, 2, 16)
    out = run(sequence.MultiHeadAttentionNode, ctx, {"query": q, "key": q, "value": q}, embed_dim=16, num_heads=4)
    assert out["output"].shape == (4, 2, 16) and out["weights"].shape == (2, 4, 4)
    assert torch.allclose(out["weights"].sum(-1), torch.ones(2, 4))
    enc = run(sequence.TransformerEncoderNode, ctx, {"tensor": q}, d_model=16, nhead=4, num_layers=2,
              dim_feedforward=32)["tensor"]
    assert enc.shape == (4, 2, 16)
    dec = run(sequence.TransformerDecoderNode, ctx, {"tensor": torch.randn(3, 2, 16), "memory": q},
              d_model=16, nhead=4, num_layers=1, dim_feedforward=32)["tensor"]
    assert dec.shape == (3, 2, 16)
    with pytest.raises(ValueError, match="embed_dim=10 must be divisible by num_heads=4"):
        run(sequence.MultiHeadAttentionNode, ctx, {"query": q, "key": q, "value": q}, embed_dim=10, num_heads=4)


def test_moe_routes_each_token_to_top_k_experts(ctx: RunContext) -> None:
    x = torch.randn(2, 3, 8)
    out = run(sequence.MoELayerNode, ctx, {"x": x}, hidden_dim=8, expert_hidden_dim=16)
    assert out["output"].shape == (2, 3, 8)
    assert out["routing_weights"].shape == (2, 3, 2) and out["expert_indices"].shape == (2, 3, 2)
    assert torch.allclose(out["routing_weights"].sum(-1), torch.ones(2, 3))
    again = run(sequence.MoELayerNode, ctx, {"x": x}, hidden_dim=8, expert_hidden_dim=16)
    assert torch.equal(out["output"], again["output"])  # the seed fixes the weights


def test_embedding_lookup_and_bounds(ctx: RunContext) -> None:
    out = run(sequence.EmbeddingNode, ctx, {"tensor": torch.tensor([[0, 3], [3, 9]])}, num_embeddings=10,
              embedding_dim=4, padding_idx=0)["tensor"]
    assert out.shape == (2, 2, 4)
    assert torch.equal(out[0, 0], torch.zeros(4)) and torch.equal(out[0, 1], out[1, 0])
    with pytest.raises(ValueError, match="indices run from 0 to 10 but num_embeddings=10 allows 0..9"):
        run(sequence.EmbeddingNode, ctx, {"tensor": torch.tensor([0, 10])}, num_embeddings=10)


# -- graphs: validation and whole runs -------------------------------------------------------
def _graph(nodes: list[tuple[str, str, dict[str, Any]]], edges: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    return {"nodes": [{"id": "start", "type": "Start", "data": {"params": {}}}]
            + [{"id": i, "type": t, "data": {"params": p}} for i, t, p in nodes],
            "edges": [{"source": "start", "sourceHandle": "trigger", "target": nodes[0][0], "type": "trigger"}]
            + [{"source": s, "sourceHandle": sh, "target": t, "targetHandle": th} for s, sh, t, th in edges]}


def test_split_pieces_validate_up_to_chunks(registry: Registry) -> None:
    nodes = [("src", "TensorCreate", {"shape": "6"}), ("split", "Split", {"chunks": 3}),
             ("p", "Print", {})]
    ok = _graph(nodes, [("src", "tensor", "split", "tensor"), ("split", "chunk_2", "p", "value")])
    plan, errors = validate_graph(ok, registry)
    assert errors == [] and plan is not None
    bad = _graph(nodes, [("src", "tensor", "split", "tensor"), ("split", "chunk_3", "p", "value")])
    _plan, errors = validate_graph(bad, registry)
    assert [(e["code"], e["value"]) for e in errors] == [("bad_port", "chunk_3")]


@pytest.mark.parametrize(("type_name", "says"), [
    ("Visualize2000", "not a CodefyUI built-in: a custom node"),
    ("rl:PolicyNet", "a node of the plugin pack 'rl'"),
])
def test_unknown_type_says_what_kind_and_no_knock_on_errors(registry: Registry, type_name: str, says: str) -> None:
    g = _graph([("u", type_name, {}), ("a", "Add", {}), ("b", "Softmax", {})],
               [("u", "tensor", "a", "tensor_a"), ("u", "tensor", "a", "tensor_b"), ("a", "tensor", "b", "tensor")])
    plan, errors = validate_graph(g, registry)
    assert plan is None
    assert [e["code"] for e in errors] == ["unknown_type"]
    assert says in errors[0]["message"] and type_name in errors[0]["message"]


def test_every_codefyui_builtin_is_implemented(registry: Registry) -> None:
    assert sorted(set(INTERFACES) - set(registry.nodes)) == []


def test_a_codefyui_builtin_cdui_lacks_is_named_as_such(registry: Registry) -> None:
    # Every built-in exists now; a machine lacks one when it is hidden there
    # (CODEFYUI_NODES_HIDE) or by an older cdui: a registry without Conv2d.
    reduced = copy.copy(registry)
    reduced.nodes = {k: v for k, v in registry.nodes.items() if k != "Conv2d"}
    g = _graph([("conv", "Conv2d", {})], [])
    _plan, errors = validate_graph(g, reduced)
    assert [e["code"] for e in errors] == ["unknown_type"]
    assert "a CodefyUI built-in that this version of cdui does not have yet" in errors[0]["message"]


def test_the_later_of_two_edges_into_one_input_wins(registry: Registry) -> None:
    g = _graph([("one", "TensorCreate", {"shape": "2", "fill": "ones"}),
                ("zero", "TensorCreate", {"shape": "2", "fill": "zeros"}), ("p", "Print", {})],
               [("one", "tensor", "p", "value"), ("zero", "tensor", "p", "value")])
    g["edges"].append({"source": "start", "sourceHandle": "trigger", "target": "zero", "type": "trigger"})
    plan, errors = validate_graph(g, registry)
    assert errors == [] and plan is not None
    printer = next(pn for pn in plan.order if pn.id == "p")
    assert printer.inputs == {"value": ("zero", "tensor")}


# -- weights move both ways ------------------------------------------------------------------------
MLP = json.dumps({"version": 2, "nodes": [
    {"id": "in", "type": "Input", "ports": [{"id": "p_x", "name": "x"}]},
    {"id": "l1", "type": "Linear", "params": {"in_features": 4, "out_features": 3}},
    {"id": "bn", "type": "BatchNorm1d", "params": {"num_features": 3}},
    {"id": "out", "type": "Output", "ports": [{"id": "p_y", "name": "y"}]}], "edges": [
    {"id": "e1", "source": "in", "sourceHandle": "p_x", "target": "l1"},
    {"id": "e2", "source": "l1", "target": "bn"},
    {"id": "e3", "source": "bn", "target": "out", "targetHandle": "p_y"}]})
CODEFYUI_KEYS = {"layers.l1.weight", "layers.l1.bias", "layers.bn.weight", "layers.bn.bias",
                 "layers.bn.running_mean", "layers.bn.running_var", "layers.bn.num_batches_tracked"}


def test_sequential_model_keys_are_codefyuis(ctx: RunContext) -> None:
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    assert set(model.state_dict()) == CODEFYUI_KEYS


def test_weights_saved_by_codefyui_and_by_cdui_01_load(ctx: RunContext, tmp_path: Path) -> None:
    torch.manual_seed(1)
    trained = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    # A file as CodefyUI writes it (its key layout is ours) ...
    torch.save(trained.state_dict(), models / "codefyui.pt")
    # ... and one as cdui 0.1 wrote it: the same weights without the "layers." level.
    torch.save({k.removeprefix("layers."): v for k, v in trained.state_dict().items()}, models / "old.pt")
    warnings: list[tuple[str, dict[str, Any]]] = []
    wctx = RunContext("run-2", Layout.for_data_dir(tmp_path), emit=lambda kind, data: warnings.append((kind, data)))
    for name in ("codefyui.pt", "old.pt"):
        fresh = run(layers.SequentialModelNode, wctx, layers=MLP)["model"]
        loaded = run(fileio.ModelLoaderNode, wctx, {"model": fresh}, path=name, device="cpu")["model"]
        for key, value in trained.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (name, key)
    legacy = [d for k, d in warnings if k == "run_warning" and d.get("kind") == "legacy_weights"]
    assert len(legacy) == 1 and "old.pt" in legacy[0]["message"]


def test_weights_of_another_model_are_refused_with_the_keys_named(ctx: RunContext, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    torch.save({"layers.c1.weight": torch.zeros(1)}, models / "other.pt")
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    with pytest.raises(ValueError, match=r"the model has 7 weight\(s\) the file lacks .*the file has 1 weight"):
        run(fileio.ModelLoaderNode, ctx, {"model": model}, path="other.pt", device="cpu")


def test_every_built_in_type_is_in_the_docs_table(registry: Registry) -> None:
    page = (Path(__file__).parent.parent / "docs" / "graphs-and-nodes.md").read_text(encoding="utf-8")
    builtin = sorted(n for n, source in registry.sources.items() if source == "builtin")
    assert [n for n in builtin if f"| `{n}` |" not in page] == []


# -- optional extras: scikit-learn and matplotlib node families ------------------------------------
IRIS_LIKE = torch.tensor([[0.0, 0.0], [0.1, 0.2], [0.2, 0.1], [5.0, 5.0], [5.1, 4.9], [4.8, 5.2]])
IRIS_LABELS = ["a", "a", "a", "b", "b", "b"]
QUERY = torch.tensor([[0.05, 0.1], [5.0, 5.1]])


@pytest.mark.parametrize("cls", [classical_sklearn.DecisionTreeClassifierNode,
                                 classical_sklearn.LogisticRegressionNode, classical_sklearn.MLPClassifierNode,
                                 classical_sklearn.RandomForestClassifierNode, classical_sklearn.SVMClassifierNode])
def test_sklearn_classifiers_agree_with_scikit_learn(ctx: RunContext, cls: type[Node]) -> None:
    out = run(cls, ctx, {"x_train": IRIS_LIKE, "y_train": IRIS_LABELS, "x_query": QUERY})
    assert out["predictions"] == ["a", "b"] and out["classes"] == ["a", "b"]
    if "probabilities" in out:
        assert out["probabilities"].shape == (2, 2)
        assert torch.allclose(out["probabilities"].sum(1), torch.ones(2))


def test_sklearn_outputs_are_sklearns_own(ctx: RunContext) -> None:
    from sklearn.linear_model import LinearRegression
    from sklearn.tree import DecisionTreeClassifier, export_text

    tree = run(classical_sklearn.DecisionTreeClassifierNode, ctx,
               {"x_train": IRIS_LIKE, "y_train": IRIS_LABELS, "x_query": QUERY})
    ref = DecisionTreeClassifier(max_depth=5, random_state=42).fit(IRIS_LIKE.double().numpy(), IRIS_LABELS)
    assert tree["tree_text"] == export_text(ref)
    x = torch.tensor([[1.0], [2.0], [3.0]])
    lin = run(classical_sklearn.LinearRegressionNode, ctx,
              {"x_train": x, "y_train": torch.tensor([3.0, 5.0, 7.0]), "x_query": torch.tensor([[10.0]])})
    ref_lin = LinearRegression().fit(x.double().numpy(), [3.0, 5.0, 7.0])
    assert lin["intercept"] == pytest.approx(float(ref_lin.intercept_)) == pytest.approx(1.0)
    assert lin["predictions"].tolist() == pytest.approx([21.0])


def test_synthetic_dataset_is_seeded_like_scikit_learns(ctx: RunContext) -> None:
    from sklearn.datasets import make_moons

    out = run(classical_sklearn.SyntheticDatasetNode, ctx, kind="moons", n_samples=20)
    x, y = make_moons(n_samples=20, noise=0.1, random_state=42)
    assert torch.equal(out["tensor"], torch.as_tensor(x, dtype=torch.float32))
    assert out["labels"] == [str(int(v)) for v in y] and out["columns"] == ["x0", "x1"]


def _png_size(b64: str) -> tuple[int, int]:
    import base64
    import struct

    raw = base64.b64decode(b64)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", raw[16:24])


@pytest.mark.parametrize("plot_type", ["line", "histogram", "heatmap", "image"])
def test_visualize_returns_an_800x600_png_and_keeps_it_as_media(tmp_path: Path, plot_type: str) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    ctx = RunContext("run-9", Layout.for_data_dir(tmp_path), emit=lambda kind, data: events.append((kind, data)))
    ctx.node_id = "viz"
    data = torch.rand(4, 3, 8, 8) if plot_type == "image" else torch.randn(50)
    out = run(plots.VisualizeNode, ctx, {"data": data}, plot_type=plot_type, title="t")
    assert _png_size(out["image"]) == (800, 600)
    media = tmp_path / "media" / "run-9" / "viz.png"
    assert media.read_bytes() == __import__("base64").b64decode(out["image"])
    assert [d["kind"] for k, d in events if k == "artifact"] == ["media"]


def test_scatter_and_decision_boundary_pngs(ctx: RunContext) -> None:
    from sklearn.svm import SVC

    ctx.node_id = "plot"
    out = run(plots.ScatterPlot2DNode, ctx, {"points": IRIS_LIKE, "labels": IRIS_LABELS})
    assert _png_size(out["image"]) == (600, 600)
    model = SVC().fit(IRIS_LIKE.numpy(), IRIS_LABELS)
    out = run(plots.DecisionBoundaryNode, ctx, {"model": model, "x_train": IRIS_LIKE, "y_train": IRIS_LABELS},
              grid_steps=20, show_support_vectors=True)
    assert _png_size(out["image"]) == (600, 600)
    with pytest.raises(ValueError, match="has no predict"):
        run(plots.DecisionBoundaryNode, ctx, {"model": torch.nn.Linear(2, 2), "x_train": IRIS_LIKE,
                                              "y_train": IRIS_LABELS})


def test_plot_nodes_make_the_run_write_files(registry: Registry) -> None:
    from cdui.nodes.base import file_usage

    assert file_usage(plots.VisualizeNode, {}, "viz").writes == ["viz writes into data/media/"]


def test_a_missing_extra_is_marked_in_the_catalog_and_refused_at_validation(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from cdui.nodes import base

    # This Python without scikit-learn: the import system finds no sklearn.
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setattr(base, "_AVAILABLE", {})
    entry = next(n for n in registry.catalog() if n["type"] == "SVMClassifier")
    assert (entry["available"], entry["extra"]) == (False, "classical")
    assert "bin/cdui start --extras classical" in entry["install"]
    graph = {"nodes": [{"id": "start", "type": "Start", "data": {}},
                       {"id": "svm", "type": "SVMClassifier", "data": {}}],
             "edges": [{"source": "start", "sourceHandle": "trigger", "target": "svm", "type": "trigger"}]}
    _plan, errors = validate_graph(graph, registry, layout=Layout.for_data_dir(tmp_path))
    codes = [e["code"] for e in errors]
    assert "missing_extra" in codes
    message = errors[codes.index("missing_extra")]["message"]
    assert message.startswith("SVMClassifier 'svm': needs scikit-learn, which is not installed on this machine")
    assert next(n for n in registry.catalog() if n["type"] == "Linear")["available"] is True
