"""CodefyUI's own example graphs, vendored unchanged under
tests/data/codefyui_examples/ (SOURCE.md names each one's origin), validated
and run to completion through cdui's real validator and executor in this
process, with each result checked against a value computed here."""
from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.graph.executor import Executor
from cdui.graph.presets import preset_library
from cdui.graph.validate import validate_graph
from cdui.nodes.registry import Registry, build_registry
from codefyui_example_data import CNN_WEIGHTS, cnn_forward, example, example_names, write_example_data

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return build_registry()


def run_example(name: str, registry: Registry, data_dir: Path) -> dict[str, dict[str, Any]]:
    layout = Layout.for_data_dir(data_dir)
    plan, errors = validate_graph(example(name), registry, preset_library(), layout=layout)
    assert errors == [] and plan is not None
    ctx = RunContext("run-1", layout, emit=lambda kind, data: None)
    return Executor(registry, ctx).run(plan)


def test_rnn_one_step_unrolls_one_cell_three_times(registry: Registry, tmp_path: Path) -> None:
    out = run_example("RNN-OneStep", registry, tmp_path)
    # The three cells share their seed, so h_3 is one cell applied three times from zeros.
    cell = registry.get("RNNCell")
    assert cell is not None
    from cdui.nodes.builtin.sequence import seeded_rnn_cell
    ref = seeded_rnn_cell(4, 8, "tanh", 42)
    h = torch.zeros(1, 8)
    with torch.no_grad():
        for x in ("x1", "x2", "x3"):
            h = ref(out[x]["tensor"], h)
    assert out["print"]["value"].shape == (1, 8)
    assert torch.allclose(out["print"]["value"], h)


def test_moe_top_k_routing_keeps_the_shape_and_picks_two_experts(registry: Registry, tmp_path: Path) -> None:
    out = run_example("MoE-TopK-Routing", registry, tmp_path)
    assert out["print_out"]["value"].shape == (2, 5, 32)
    weights, idx = out["print_w"]["value"], out["print_idx"]["value"]
    assert weights.shape == (2, 5, 2) and idx.shape == (2, 5, 2)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 5))
    assert idx.min().item() >= 0 and idx.max().item() <= 3
    assert bool((idx[..., 0] != idx[..., 1]).all())


def test_rlhf_reward_and_kl(registry: Registry, tmp_path: Path) -> None:
    out = run_example("RLHF-Reward-and-KL", registry, tmp_path)
    assert out["print_r"]["value"].shape == (4,)
    p = torch.softmax(out["p"]["tensor"], -1)
    # KL against the uniform reference over 4 actions, batchmean over one row.
    want = (p * (p.log() - math.log(0.25))).sum()
    assert torch.allclose(out["print_kl"]["value"], want)


def test_api_function_echoes_its_default_on_the_canvas(registry: Registry, tmp_path: Path) -> None:
    out = run_example("Api-Function", registry, tmp_path)
    assert out["print-1"]["value"] == "hello from the canvas"


def test_mini_unet_compact_denoises_one_step_in_shape(registry: Registry, tmp_path: Path) -> None:
    out = run_example("Mini-UNet-Compact", registry, tmp_path)
    assert out["print"]["value"].shape == (1, 3, 16, 16)
    assert bool(torch.isfinite(out["print"]["value"]).all())


def test_toy_sampling_runs_twenty_steps_and_plots(registry: Registry, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="Visualize needs the plots extra (matplotlib)")
    out = run_example("Toy-Sampling", registry, tmp_path)
    assert out["print"]["value"].shape == (1, 3, 16, 16)
    assert base64.b64decode(out["viz_x0"]["image"]).startswith(PNG_MAGIC)


def test_forward_process_blends_a_digit_with_noise(registry: Registry, tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image", reason="ImageReader needs the vision extra (Pillow)")
    pytest.importorskip("matplotlib", reason="Visualize needs the plots extra (matplotlib)")
    (tmp_path / "images").mkdir()
    pixels = bytes((i * 7) % 256 for i in range(28 * 28))
    image.frombytes("L", (28, 28), pixels).save(tmp_path / "images" / "test_digit.png")
    out = run_example("Forward-Process", registry, tmp_path)
    x0 = torch.tensor(list(pixels), dtype=torch.float32).reshape(1, 28, 28) / 255.0
    noise = torch.randn((1, 28, 28), generator=torch.Generator().manual_seed(42))
    assert torch.allclose(out["print_xt"]["value"].reshape(1, 28, 28), 0.75 * x0 + 0.25 * noise, atol=1e-6)
    assert out["print_emb"]["value"].shape == (1, 32)
    assert base64.b64decode(out["viz_xt"]["image"]).startswith(PNG_MAGIC)


# -- every vendored example ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def example_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("numpy", reason="the CIFAR10 batches are numpy arrays")
    pytest.importorskip("PIL.Image", reason="test_digit.png is written with Pillow (the vision extra)")
    root = tmp_path_factory.mktemp("example-data")
    write_example_data(root)
    return root


@pytest.mark.parametrize("name", example_names())
def test_every_example_validates_given_its_datasets(name: str, registry: Registry, example_data: Path) -> None:
    """Validation only (the whole plan, with the Dataset nodes' check that their
    files are on this machine); tests/test_codefyui_examples_e2e.py runs them."""
    plan, errors = validate_graph(example(name), registry, preset_library(),
                                  layout=Layout.for_data_dir(example_data))
    assert errors == [] and plan is not None


def test_word_embedding_analogy_finds_queen(registry: Registry, tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="EmbeddingScatter needs the classical extra (scikit-learn)")
    out = run_example("Word-Embedding-Analogy", registry, tmp_path)
    # Cosines with king - man + woman = (royalty 1, feminine 1), worked out by hand from the
    # vocabulary: queen 1, duchess 0.949, princess 0.911, mother 0.707, goddess 0.704.
    assert out["similarity"]["top_k_labels"] == [["queen", "duchess", "princess", "mother", "goddess"]]
    assert out["print_top"]["value"] == [["queen", "duchess", "princess", "mother", "goddess"]]
    points = out["scatter"]["points_2d"]
    assert points.shape == (59, 2) and float(points.abs().max()) == pytest.approx(1.0)
    assert out["scatter"]["labels"] == sorted(out["scatter"]["labels"]) and len(out["scatter"]["labels"]) == 59


# -- weights trained by CodefyUI ------------------------------------------------------------------
def write_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    """As CodefyUI's ModelSaver writes a state_dict: torch.save, or safetensors' save_file."""
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(weights, str(path))
    else:
        torch.save(weights, path)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """As CodefyUI's ModelLoader reads one (state_dict mode)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, weights_only=True)


def _node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "data": {"params": params}}


def _edge(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
    return {"source": src, "sourceHandle": sh, "target": dst, "targetHandle": th}


@pytest.mark.parametrize("fmt", ["pytorch", "safetensors"])
def test_weights_trained_by_codefyui_load_compute_and_save_back(fmt: str, registry: Registry,
                                                                 tmp_path: Path) -> None:
    """A file as CodefyUI writes it (built here by key name, not by cdui's model) loads
    into cdui's SequentialModel, computes what the layers compute, and ModelSaver
    writes it back with the same keys and tensors, which CodefyUI loads strictly."""
    ext = {"pytorch": "pt", "safetensors": "safetensors"}[fmt]
    if fmt == "safetensors":
        pytest.importorskip("safetensors", reason="the safetensors extra")
    gen = torch.Generator().manual_seed(7)
    weights = {k: torch.randn(shape, generator=gen) * 0.05 for k, shape in CNN_WEIGHTS.items()}
    models = tmp_path / "models"
    models.mkdir()
    write_weights(weights, models / f"codefyui.{ext}")
    spec = next(n for n in example("TrainCNN-MNIST")["nodes"] if n["id"] == "model-builder")["data"]["params"]
    graph = {"nodes": [
        _node("start", "Start"), _node("model", "SequentialModel", **spec),
        _node("load", "ModelLoader", path=f"codefyui.{ext}", load_mode="state_dict", device="cpu", strict=True),
        _node("x", "TensorCreate", shape="2,1,28,28", fill="full", value=0.25),
        _node("infer", "Inference", device="cpu"),
        _node("save", "ModelSaver", path="back.pt", save_mode="state_dict", format=fmt)],
        "edges": [{"source": "start", "sourceHandle": "trigger", "target": t, "type": "trigger"}
                  for t in ("model", "x")]
        + [_edge("model", "model", "load", "model"), _edge("load", "model", "infer", "model"),
           _edge("x", "tensor", "infer", "input"), _edge("load", "model", "save", "model")]}
    layout = Layout.for_data_dir(tmp_path)
    plan, errors = validate_graph(graph, registry, preset_library(), layout=layout)
    assert errors == [] and plan is not None
    out = Executor(registry, RunContext("run-1", layout, emit=lambda kind, data: None)).run(plan)
    assert torch.allclose(out["infer"]["output"], cnn_forward(weights, torch.full((2, 1, 28, 28), 0.25)), atol=1e-5)
    back_path = models / f"back.{ext}"
    assert out["save"]["path"] == str(back_path)
    back = read_weights(back_path)
    assert sorted(back) == sorted(weights)
    assert all(torch.equal(back[k], weights[k]) for k in weights)


def test_dataset_on_a_workers_transfer_run_reads_the_machines_data_folder(registry: Registry,
                                                                         tmp_path: Path) -> None:
    """A worker's transfer run has a fresh data folder of its own; the datasets stay in
    the machine's data folder, which the run's layout names as ``datasets``."""
    from cdui.nodes.offline_datasets import DATASETS_FOLDER
    from codefyui_example_data import write_mnist

    machine = tmp_path / "machine-data"
    write_mnist(machine)
    dataset = registry.get("Dataset")
    assert dataset is not None
    run_layout = Layout.for_data_dir(tmp_path / "agent-runs" / "r1" / "data")
    params = {"name": "MNIST", "split": "train", "data_dir": "./data"}
    assert [code for code, _ in dataset.preflight(params, run_layout)] == ["missing_dataset"]
    run_layout.folders[DATASETS_FOLDER] = machine
    assert dataset.preflight(params, run_layout) == []
    escape = dataset.preflight({**params, "data_dir": "./data/../../elsewhere"}, run_layout)
    assert [code for code, _ in escape] == ["bad_param"]
