"""CodefyUI's built-in presets and its Dataset node, run through the real
validator and executor in this process, on datasets written by the test in
torchvision's on-disk layouts (cdui never downloads)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.layout import INSTALL_ROOT, Layout
from cdui.graph.context import RunContext
from cdui.graph.executor import Executor
from cdui.graph.presets import preset_library
from cdui.graph.validate import validate_graph
from cdui.nodes import offline_datasets
from cdui.nodes.builtin.layers import DEFAULT_LAYERS
from cdui.nodes.registry import Registry, build_registry

LAUNCHER = INSTALL_ROOT / "bin" / "cdui"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return build_registry()


def idx(array: torch.Tensor) -> bytes:
    """An IDX file of unsigned bytes, as MNIST's are."""
    return struct.pack(">HBB", 0, 0x08, array.dim()) + struct.pack(f">{array.dim()}I", *array.shape) + \
        bytes(array.flatten().tolist())


def write_mnist(root: Path, n: int = 64, name: str = "MNIST") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.uint8)
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    for prefix in ("train", "t10k"):
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(idx(images))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(idx(labels))
    return images, labels


def run_graph(graph: dict[str, Any], registry: Registry, layout: Layout) -> tuple[dict[str, Any], list[Any]]:
    plan, errors = validate_graph(graph, registry, preset_library(), layout=layout)
    assert errors == [] and plan is not None
    events: list[Any] = []
    ctx = RunContext("run-1", layout, emit=lambda kind, data: events.append((kind, data)))
    return Executor(registry, ctx).run(plan), events


def node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "data": {"params": params}}


def edge(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
    return {"source": src, "sourceHandle": sh, "target": dst, "targetHandle": th}


def trigger(dst: str) -> dict[str, Any]:
    return {"source": "start", "sourceHandle": "trigger", "target": dst, "type": "trigger"}


# -- the Dataset node ------------------------------------------------------------------------------
def test_dataset_reads_mnist_as_torchvision_with_codefyuis_transform(tmp_path: Path, registry: Registry) -> None:
    images, labels = write_mnist(tmp_path)
    ds = offline_datasets.load(tmp_path, "MNIST", "train")
    assert len(ds) == 64
    x, y = ds[5]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y == int(labels[5])
    # ToTensor (divide by 255) then Normalize(0.5, 0.5): pixels in [-1, 1].
    assert torch.equal(x[0], images[5].to(torch.float32).div(255).sub(0.5).div(0.5))
    graph = {"nodes": [node("start", "Start"), node("ds", "Dataset", name="MNIST", split="test"),
                       node("batch", "DatasetBatch", batch_size=4, start_index=62)],
             "edges": [trigger("ds"), edge("ds", "dataset", "batch", "dataset")]}
    outputs, _ = run_graph(graph, registry, Layout.for_data_dir(tmp_path))
    assert outputs["batch"]["images"].shape == (4, 1, 28, 28)
    assert outputs["batch"]["labels"].tolist() == [int(labels[i]) for i in (62, 63, 0, 1)]  # wraps around


def test_a_missing_dataset_is_refused_at_validation_with_the_files_and_the_command(tmp_path: Path,
                                                                                    registry: Registry) -> None:
    graph = {"nodes": [node("start", "Start"), node("ds", "Dataset", name="FashionMNIST"),
                       node("batch", "DatasetBatch")],
             "edges": [trigger("ds"), edge("ds", "dataset", "batch", "dataset")]}
    plan, errors = validate_graph(graph, registry, layout=Layout.for_data_dir(tmp_path))
    assert plan is None and [e["code"] for e in errors] == ["missing_dataset"]
    message = errors[0]["message"]
    assert f"2 file(s) missing in {tmp_path / 'FashionMNIST' / 'raw'}" in message
    assert "train-images-idx3-ubyte, train-labels-idx1-ubyte" in message
    assert "cdui datasets import FashionMNIST t10k-images-idx3-ubyte.gz" in message
    # Without a machine to check (a run bound for a worker), validation says nothing about it.
    assert validate_graph(graph, registry)[1] == []


def _spec_for(files: dict[str, bytes], folder: str, splits: dict[str, tuple[str, ...]]) -> offline_datasets.Spec:
    return offline_datasets.Spec(folder, splits, {n: hashlib.md5(b, usedforsecurity=False).hexdigest()
                                                  for n, b in files.items()}, "the test")


def test_import_checks_the_md5_and_unpacks_gz_files(tmp_path: Path) -> None:
    body = idx(torch.zeros(3, 2, 2, dtype=torch.uint8))
    archive = tmp_path / "dl" / "t10k-images-idx3-ubyte.gz"
    archive.parent.mkdir()
    archive.write_bytes(gzip.compress(body))
    spec = _spec_for({archive.name: archive.read_bytes()}, "MNIST/raw", offline_datasets.SPECS["MNIST"].splits)
    root = tmp_path / "data"
    written = offline_datasets.import_archive("MNIST", archive, root, {"MNIST": spec})
    assert written == [root / "MNIST" / "raw" / "t10k-images-idx3-ubyte"]
    assert written[0].read_bytes() == body
    # The real table: this file is not the published one.
    with pytest.raises(ValueError, match="has MD5 .* but the published t10k-images-idx3-ubyte.gz has "
                                         "9fb629c4189551a2d022fa330f9573f3"):
        offline_datasets.import_archive("MNIST", archive, root)


def test_import_of_a_tar_writes_only_the_datasets_own_files(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("cifar-10-batches-py/test_batch", b"T"), ("cifar-10-batches-py/batches.meta", b"M"),
                           ("cifar-10-batches-py/../../evil", b"X"), ("/etc/evil", b"X")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(buf.getvalue())
    spec = _spec_for({archive.name: archive.read_bytes()}, "cifar-10-batches-py",
                     {"test": ("test_batch", "batches.meta")})
    root = tmp_path / "data"
    written = offline_datasets.import_archive("CIFAR10", archive, root, {"CIFAR10": spec})
    assert sorted(p.name for p in written) == ["batches.meta", "test_batch"]
    assert sorted(p.name for p in (root / "cifar-10-batches-py").iterdir()) == ["batches.meta", "test_batch"]
    assert not (tmp_path / "evil").exists()


@pytest.mark.e2e
def test_cdui_datasets_import_refuses_a_file_that_is_not_the_published_one(tmp_path: Path) -> None:
    fake = tmp_path / "train-labels-idx1-ubyte.gz"
    fake.write_bytes(gzip.compress(b"not mnist"))
    env = {"CODEFYUI_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([str(LAUNCHER), "datasets", "import", "MNIST", str(fake)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"cdui: error: {fake}: {fake} has MD5 ")
    assert "d53e105ee54ea40749a09fcbcd1e9432" in proc.stderr
    assert not (tmp_path / "data" / "MNIST").exists()


# -- the built-in presets ------------------------------------------------------------------------------
def test_the_three_codefyui_presets_ship_with_cdui() -> None:
    assert sorted(preset_library()) == ["LSTM Sequence", "Simple CNN Classifier", "Training Pipeline"]


def test_lstm_sequence_and_simple_cnn_presets_expand_and_run(tmp_path: Path, registry: Registry) -> None:
    graph = {"nodes": [node("start", "Start"),
                       node("seq", "TensorCreate", shape="2,5,128", fill="randn"),
                       {"id": "lstm", "type": "preset:LSTM Sequence", "data": {"params": {}}},
                       node("img", "TensorCreate", shape="2,1,28,28", fill="randn"),
                       {"id": "cnn", "type": "preset:Simple CNN Classifier",
                        "data": {"internalParams": {"conv2": {"out_channels": 16}}}},
                       node("p1", "Print"), node("p2", "Print"), node("p3", "Print")],
             "edges": [trigger("seq"), trigger("img"),
                       edge("seq", "tensor", "lstm", "tensor"), edge("lstm", "output", "p1", "value"),
                       edge("lstm", "hidden", "p2", "value"),
                       edge("img", "tensor", "cnn", "tensor"), edge("cnn", "tensor", "p3", "value")]}
    outputs, _ = run_graph(graph, registry, Layout.for_data_dir(tmp_path))
    out = outputs["p1"]["value"]
    assert out.shape == (2, 5, 256) and bool((out.abs() <= 1).all())  # tanh after the LSTM
    assert outputs["p2"]["value"].shape == (1, 2, 256)
    # internalParams override any inner param: conv2 has 16 channels instead of the preset's 64.
    assert outputs["p3"]["value"].shape == (2, 16, 7, 7)
    assert "lstm__lstm" in outputs and "cnn__conv2" in outputs


def test_training_pipeline_trains_a_sequential_model_on_mnist_from_disk(tmp_path: Path, registry: Registry) -> None:
    write_mnist(tmp_path, n=32)
    graph = {"nodes": [node("start", "Start"), node("model", "SequentialModel", layers=DEFAULT_LAYERS),
                       {"id": "train", "type": "preset:Training Pipeline",
                        "data": {"internalParams": {"train_loop": {"epochs": 2},
                                                    "dataloader": {"batch_size": 16}}}},
                       node("p", "Print")],
             "edges": [trigger("model"), edge("model", "model", "train", "model"),
                       edge("model", "model", "train", "model_for_opt"), edge("train", "losses", "p", "value")]}
    torch.manual_seed(0)
    outputs, _ = run_graph(graph, registry, Layout.for_data_dir(tmp_path))
    losses = outputs["p"]["value"]
    assert losses.shape == (2,) and bool(torch.isfinite(losses).all())
    trained = outputs["train__train_loop"]["model"]
    assert set(trained.state_dict()) >= {"layers.c1.weight", "layers.l2.bias"}


def test_an_installed_preset_wins_over_an_embedded_one_of_the_same_name(registry: Registry, tmp_path: Path) -> None:
    presets = Path(__file__).parent.parent / "cdui" / "graph" / "builtin_presets"
    fake = json.loads((presets / "lstm_sequence.json").read_text())
    fake["nodes"][1]["params"]["function"] = "relu"  # an embedded copy that differs
    graph = {"nodes": [node("start", "Start"), node("seq", "TensorCreate", shape="1,3,128", fill="randn"),
                       {"id": "lstm", "type": "preset:LSTM Sequence", "data": {}}, node("p", "Print")],
             "edges": [trigger("seq"), edge("seq", "tensor", "lstm", "tensor"), edge("lstm", "output", "p", "value")],
             "presets": [fake]}
    plan, errors = validate_graph(graph, registry, preset_library())
    assert errors == [] and plan is not None
    act = next(pn for pn in plan.order if pn.id == "lstm__act")
    assert act.params["function"] == "tanh"


# -- a node's own param called "preset" -----------------------------------------------------------------
def test_a_conv2dkernel_with_its_default_preset_validates_and_runs(tmp_path: Path, registry: Registry) -> None:
    """Conv2dKernel's ``preset`` param picks one of its built-in filters; it names no graph preset, so
    its default (EdgeDetection3x3) is not refused as a preset that is not installed."""
    graph = {"nodes": [node("start", "Start"), node("k", "Conv2dKernel"),
                       node("img", "TensorCreate", shape="1,1,5,5", fill="ones"),
                       node("conv", "Conv2dExplicit"), node("p", "Print")],
             "edges": [trigger("k"), trigger("img"), edge("img", "tensor", "conv", "tensor"),
                       edge("k", "tensor", "conv", "kernel"), edge("conv", "tensor", "p", "value")]}
    outputs, _ = run_graph(graph, registry, Layout.for_data_dir(tmp_path))
    kernel = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]])
    assert torch.equal(outputs["k"]["tensor"], kernel)
    expected = torch.nn.functional.conv2d(torch.ones(1, 1, 5, 5), kernel.view(1, 1, 3, 3), padding=1)
    assert torch.equal(outputs["p"]["value"], expected)


def test_a_conv2dexplicit_with_no_kernel_wired_uses_its_own_preset(tmp_path: Path, registry: Registry) -> None:
    """Later CodefyUI versions pick Conv2dExplicit's kernel with its own params and have no kernel input
    (the foundations pack's Kernel-Effects example): such a graph validates and convolves with the preset."""
    graph = {"nodes": [node("start", "Start"), node("img", "TensorCreate", shape="1,1,5,5", fill="ones"),
                       node("conv", "Conv2dExplicit", preset="Sharpen3x3", kernel_size=3, padding=1),
                       node("p", "Print")],
             "edges": [trigger("img"), edge("img", "tensor", "conv", "tensor"), edge("conv", "tensor", "p", "value")]}
    outputs, _ = run_graph(graph, registry, Layout.for_data_dir(tmp_path))
    kernel = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]])
    expected = torch.nn.functional.conv2d(torch.ones(1, 1, 5, 5), kernel.view(1, 1, 3, 3), padding=1)
    assert torch.equal(outputs["p"]["value"], expected)


def test_a_map_naming_a_preset_that_is_not_installed_is_still_refused(registry: Registry) -> None:
    graph = {"nodes": [node("start", "Start"), node("items", "GraphInput", name="items", type="json"),
                       node("m", "Map", subgraph="No Such Preset"), node("p", "Print")],
             "edges": [trigger("items"), edge("items", "value", "m", "items"), edge("m", "results", "p", "value")]}
    plan, errors = validate_graph(graph, registry, preset_library())
    assert plan is None
    assert [(e["node_id"], e["code"], e["message"]) for e in errors] == [
        ("m", "unknown_preset", "Map 'm' runs preset 'No Such Preset', which is not installed")]


@pytest.mark.e2e
def test_start_refuses_an_unknown_extra_before_starting_anything(tmp_path: Path) -> None:
    from procs import env_for

    proc = subprocess.run([str(LAUNCHER), "start", "--extras", "classical,bogus"], env=env_for(tmp_path / "ud"),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "cdui: error: unknown extra 'bogus' for --extras; use all, or a comma list of all, classical, plots, "
        "vision, safetensors, rl, tokenizers, hf, video, s3, studies")
    assert not (tmp_path / "ud").exists()
