"""Every built-in node's ``execute``, called directly with a real RunContext,
real torch and real files under ``tmp_path``.

A few tests also run whole graphs (CodefyUI's own iris examples and
``examples/iris_train.json``) through :func:`run_graph`, a deliberately tiny
driver that only wires outputs to inputs in dependency order; the real
executor (validation, presets, reachability) is tested elsewhere.
"""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.errors import PathRefused
from cdui.core.layout import INSTALL_ROOT, Layout
from cdui.graph.context import RunContext, RunStopped
from cdui.nodes.base import Node
from cdui.nodes.builtin import classical, compose, control, data, datasets, fileio, layers, notify, training
from cdui.nodes.builtin.training_loop import TrainingLoopNode
from cdui.nodes.registry import Registry, build_registry

EXAMPLES = INSTALL_ROOT / "examples"
CODEFYUI_EXAMPLES = Path(__file__).parent / "data" / "codefyui_examples"
IRIS = {"path": "data/samples/iris.csv", "target_column": "species", "include_columns": "",
        "skip_header": True}
MLP = json.dumps({"version": 2, "nodes": [
    {"id": "in", "type": "Input", "ports": [{"id": "p_x", "name": "x"}]},
    {"id": "l1", "type": "Linear", "params": {"in_features": 4, "out_features": 16}},
    {"id": "r1", "type": "ReLU"},
    {"id": "l2", "type": "Linear", "params": {"in_features": 16, "out_features": 3}},
    {"id": "out", "type": "Output", "ports": [{"id": "p_y", "name": "y"}]}], "edges": [
    {"id": "e1", "source": "in", "sourceHandle": "p_x", "target": "l1"},
    {"id": "e2", "source": "l1", "target": "r1"},
    {"id": "e3", "source": "r1", "target": "l2"},
    {"id": "e4", "source": "l2", "target": "out", "targetHandle": "p_y"}]})


class Events(list):
    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        self.append((kind, payload))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [p for k, p in self if k == kind]


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def ctx(tmp_path: Path, events: Events) -> RunContext:
    return RunContext("run-1", Layout.for_data_dir(tmp_path), emit=events)


def run(node_cls: type[Node], ctx: RunContext, inputs: dict[str, Any] | None = None,
        **params: Any) -> dict[str, Any]:
    merged = {p.name: p.default for p in node_cls.define_params()}
    merged.update(params)
    ctx.node_id, ctx.node_type = node_cls.NODE_NAME.lower(), node_cls.NODE_NAME
    return node_cls().execute(inputs or {}, merged, ctx)


def run_graph(graph: dict[str, Any], ctx: RunContext, registry: Registry) -> dict[str, dict[str, Any]]:
    nodes = {n["id"]: n for n in graph["nodes"] if n["type"] != "note"}
    data_edges = [e for e in graph["edges"] if e.get("type") != "trigger"]
    outputs: dict[str, dict[str, Any]] = {}
    pending = list(nodes)
    while pending:
        ready = [n for n in pending if all(e["source"] in outputs for e in data_edges if e["target"] == n)]
        assert ready, f"cycle or missing source among {pending}"
        for nid in ready:
            cls = registry.get(nodes[nid]["type"])
            assert cls is not None, nodes[nid]["type"]
            inputs = {e["targetHandle"]: outputs[e["source"]][e["sourceHandle"]]
                      for e in data_edges if e["target"] == nid}
            params = {p.name: p.default for p in cls.define_params()}
            params.update(nodes[nid]["data"].get("params", {}))
            ctx.node_id, ctx.node_type = nid, nodes[nid]["type"]
            outputs[nid] = cls().execute(inputs, params, ctx)
            pending.remove(nid)
    return outputs


def iris_split(ctx: RunContext, stratify: bool = True) -> dict[str, Any]:
    csv = run(data.CSVReaderNode, ctx, **IRIS)
    norm = run(data.NormalizeNode, ctx, {"tensor": csv["tensor"]})
    return run(data.TrainTestSplitNode, ctx, {"features": norm["tensor"], "labels": csv["labels"]},
               stratify=stratify)


def iris_training(ctx: RunContext, **loop_params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    torch.manual_seed(0)
    split = iris_split(ctx)
    ds = run(datasets.TensorDatasetNode, ctx, {"features": split["x_train"], "labels": split["y_train"]})
    loader = run(datasets.DataLoaderNode, ctx, {"dataset": ds["dataset"]}, batch_size=16)
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    inputs = {"model": model, "dataloader": loader["dataloader"],
              "optimizer": run(training.OptimizerNode, ctx, {"model": model}, lr=0.01)["optimizer"],
              "loss_fn": run(training.LossNode, ctx)["loss_fn"]}
    return inputs, run(TrainingLoopNode, ctx, inputs, **{"device": "cpu", **loop_params})


# -- control, tabular data, classical ------------------------------------------------
def test_start_has_no_work_and_print_passes_value_through(ctx: RunContext, events: Events) -> None:
    assert run(control.StartNode, ctx) == {}
    assert control.StartNode.define_outputs()[0].data_type == "TRIGGER"
    assert run(control.PrintNode, ctx, {"value": [1, 2]}, label="xs") == {"value": [1, 2]}
    assert events.of("log")[-1]["message"] == "[xs] [1, 2]"


def test_csv_reader_reads_iris_and_plain_csvs(ctx: RunContext, tmp_path: Path) -> None:
    out = run(data.CSVReaderNode, ctx, **IRIS)
    assert out["tensor"].shape == (150, 4) and out["tensor"].dtype == torch.float32
    assert out["columns"] == ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    assert out["labels"][:1] == ["setosa"] and sorted(set(out["labels"])) == ["setosa", "versicolor", "virginica"]
    assert abs(out["tensor"][:, 0].sum().item() - 876.5) < 1e-3

    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "t.csv").write_text("a,b,name,y\n1,2,x,01\n3,,y,2\n")
    out = run(data.CSVReaderNode, ctx, path="data/files/t.csv", target_column="y")
    assert out["columns"] == ["a", "b"]  # `name` is not numeric
    assert out["labels"] == ["1", "2"]  # integral labels spelled as pandas would
    assert torch.isnan(out["tensor"][1, 1])
    out = run(data.CSVReaderNode, ctx, path="data/files/t.csv", include_columns="b")
    assert out["tensor"].shape == (2, 1) and out["labels"] == []
    (tmp_path / "files" / "raw.csv").write_text("1,2\n3,4\n")
    out = run(data.CSVReaderNode, ctx, path="data/files/raw.csv", skip_header=False, target_column="1")
    assert out["columns"] == ["0"] and out["labels"] == ["2", "4"]
    with pytest.raises(ValueError, match="target_column"):
        run(data.CSVReaderNode, ctx, path="data/files/t.csv", target_column="nope")
    with pytest.raises(FileNotFoundError):
        run(data.CSVReaderNode, ctx, path="data/files/missing.csv")


def test_csv_reader_finds_scikit_learn_style_names_in_the_iris_sample(ctx: RunContext, events: Events,
                                                                        tmp_path: Path) -> None:
    """CodefyUI's packs name the sample's columns as scikit-learn does ("petal length (cm)"); the sample writes
    "petal_length". A name not in the header is looked up without case, a unit in brackets and separators,
    saying so in the log; one matching no column, or several, is still refused listing the header."""
    out = run(data.CSVReaderNode, ctx, **{**IRIS, "include_columns": "petal length (cm),Petal Width (cm)",
                                          "target_column": "Species"})
    assert out["columns"] == ["petal_length", "petal_width"] and out["tensor"].shape == (150, 2)
    assert out["labels"][:1] == ["setosa"]
    said = [e["message"] for e in events.of("log")]
    assert "CSVReader: column 'petal length (cm)' read as the file's 'petal_length'" in said, said
    with pytest.raises(ValueError, match=r"unknown columns: \['petal area \(cm\)'\]"):
        run(data.CSVReaderNode, ctx, **{**IRIS, "include_columns": "petal area (cm)"})
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "two.csv").write_text("a b,a_b,c\n1,2,3\n")
    with pytest.raises(ValueError, match=r"unknown columns: \['A-B'\]"):  # two columns have its key
        run(data.CSVReaderNode, ctx, path="data/files/two.csv", include_columns="A-B")


def test_column_selector_by_index_and_by_name(ctx: RunContext) -> None:
    x = torch.arange(12.0).reshape(3, 4)
    assert run(data.ColumnSelectorNode, ctx, {"tensor": x}, indices="2,3")["tensor"].tolist()[0] == [2.0, 3.0]
    out = run(data.ColumnSelectorNode, ctx, {"tensor": x, "columns": ["a", "b", "c", "d"]}, names="d,a")
    assert out["tensor"][0].tolist() == [3.0, 0.0]
    with pytest.raises(ValueError, match="out-of-range"):
        run(data.ColumnSelectorNode, ctx, {"tensor": x}, indices="4")
    with pytest.raises(ValueError, match="columns"):
        run(data.ColumnSelectorNode, ctx, {"tensor": x}, names="a")


def test_normalize_fits_and_reuses_stats(ctx: RunContext) -> None:
    x = torch.tensor([[1.0, 10.0, 5.0], [3.0, 20.0, 5.0], [5.0, 30.0, 5.0]])
    out = run(data.NormalizeNode, ctx, {"tensor": x})
    assert torch.allclose(out["tensor"].mean(0), torch.zeros(3), atol=1e-6)
    assert out["tensor"][:, 2].tolist() == [0.0, 0.0, 0.0]  # constant column: zeros, not NaN
    again = run(data.NormalizeNode, ctx, {"tensor": x * 2, "stats": out["stats"]})
    assert torch.allclose(again["tensor"][:, 0], (x[:, 0] * 2 - 3.0) / out["stats"]["std"][0])
    mm = run(data.NormalizeNode, ctx, {"tensor": x}, mode="minmax")["tensor"]
    assert mm.min().item() == 0.0 and mm.max().item() == 1.0
    unit = run(data.NormalizeNode, ctx, {"tensor": x}, mode="unit_norm", axis=1)["tensor"]
    assert torch.allclose(unit.norm(dim=1), torch.ones(3))


def test_train_test_split_shapes_and_stratification(ctx: RunContext) -> None:
    split = iris_split(ctx)
    assert split["x_train"].shape == (120, 4) and split["x_test"].shape == (30, 4)
    assert len(split["y_train"]) == 120 and len(split["y_test"]) == 30
    assert {c: split["y_test"].count(c) for c in set(split["y_test"])} == {
        "setosa": 10, "versicolor": 10, "virginica": 10}
    assert split["y_test"] == iris_split(ctx)["y_test"]  # same seed, same rows
    plain = iris_split(ctx, stratify=False)
    assert plain["x_test"].shape == (30, 4) and plain["y_test"] != split["y_test"]


def test_knn_on_iris_matches_codefyui(ctx: RunContext) -> None:
    csv = run(data.CSVReaderNode, ctx, **IRIS)
    petals = run(data.ColumnSelectorNode, ctx, {"tensor": csv["tensor"]}, indices="2,3")
    norm = run(data.NormalizeNode, ctx, {"tensor": petals["tensor"]})
    split = run(data.TrainTestSplitNode, ctx, {"features": norm["tensor"], "labels": csv["labels"]},
                stratify=True)
    knn = run(classical.KNNNode, ctx, {"x_train": split["x_train"], "y_train": split["y_train"],
                                       "x_query": split["x_test"]}, weights="distance")
    acc = run(classical.AccuracyNode, ctx, {"predictions": knn["predictions"], "labels": split["y_test"]})
    assert acc["accuracy"] > 0.8
    assert (acc["correct"], acc["total"]) == (28, 30)  # the graph's note: ~93%, two mistakes
    assert knn["classes"] == ["setosa", "versicolor", "virginica"]
    assert torch.allclose(knn["probabilities"].sum(1), torch.ones(30))


def test_knn_distance_weights_trust_exact_matches(ctx: RunContext) -> None:
    x = torch.tensor([[0.0], [1.0], [1.1], [1.2]])
    out = run(classical.KNNNode, ctx, {"x_train": x, "y_train": ["a", "b", "b", "b"],
                                       "x_query": torch.tensor([[0.0]])}, n_neighbors=4, weights="distance")
    assert out["predictions"] == ["a"] and out["probabilities"][0].tolist() == [1.0, 0.0]


def test_tensor_create_and_mean(ctx: RunContext) -> None:
    t = run(data.TensorCreateNode, ctx, shape="2,3", fill="full", value=0.5)["tensor"]
    assert t.shape == (2, 3) and t.sum().item() == 3.0
    assert run(data.TensorCreateNode, ctx, shape="4", fill="arange")["tensor"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="shape"):
        run(data.TensorCreateNode, ctx, shape="2,x")
    assert run(data.MeanNode, ctx, {"tensor": t}, dim="0")["tensor"].shape == (3,)
    assert run(data.MeanNode, ctx, {"tensor": t}, dim="0,1", keepdim=True)["tensor"].shape == (1, 1)


# -- layers, training ---------------------------------------------------------------------
def test_linear_activation_flatten(ctx: RunContext) -> None:
    x = torch.randn(2, 3, 4)
    flat = run(layers.FlattenNode, ctx, {"tensor": x})["tensor"]
    assert flat.shape == (2, 12)
    y = run(layers.LinearNode, ctx, {"tensor": flat}, in_features=12, out_features=5)["tensor"]
    assert y.shape == (2, 5)
    assert (run(layers.ActivationNode, ctx, {"tensor": y})["tensor"] >= 0).all()
    sm = run(layers.ActivationNode, ctx, {"tensor": y}, function="softmax")["tensor"]
    assert torch.allclose(sm.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="in_features"):
        run(layers.LinearNode, ctx, {"tensor": flat}, in_features=3)


def test_sequential_model_from_layer_specs(ctx: RunContext) -> None:
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    assert model(torch.randn(5, 4)).shape == (5, 3)
    assert set(model.state_dict()) == {"layers.l1.weight", "layers.l1.bias", "layers.l2.weight", "layers.l2.bias"}
    legacy = run(layers.SequentialModelNode, ctx, layers=json.dumps(
        [{"type": "Linear", "in_features": 4, "out_features": 8}, {"type": "ReLU"},
         {"type": "Linear", "params": {"in_features": 8, "out_features": 2}}]))["model"]
    assert legacy(torch.randn(3, 4)).shape == (3, 2)
    cnn = run(layers.SequentialModelNode, ctx)["model"]  # CodefyUI's default MNIST CNN
    assert cnn(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    branch = json.loads(MLP)
    branch["nodes"].insert(3, {"id": "sk", "type": "Linear", "params": {"in_features": 4, "out_features": 16}})
    branch["nodes"].insert(4, {"id": "add", "type": "Add"})
    branch["edges"] = [e for e in branch["edges"] if e["id"] != "e3"] + [
        {"id": "a", "source": "in", "target": "sk"}, {"id": "b", "source": "r1", "target": "add"},
        {"id": "c", "source": "sk", "target": "add"}, {"id": "d", "source": "add", "target": "l2"}]
    assert run(layers.SequentialModelNode, ctx, layers=branch)["model"](torch.randn(2, 4)).shape == (2, 3)
    with pytest.raises(ValueError, match="unknown layer type 'Bogus'"):
        run(layers.SequentialModelNode, ctx, layers='[{"type": "Bogus"}]')
    with pytest.raises(ValueError, match="JSON"):
        run(layers.SequentialModelNode, ctx, layers="{not json")


def test_loss_and_optimizer_reject_knobs_their_algorithm_lacks(ctx: RunContext) -> None:
    loss = run(training.LossNode, ctx, weight="1, 2, 3", label_smoothing=0.1)["loss_fn"]
    assert isinstance(loss, torch.nn.CrossEntropyLoss) and loss.weight.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="does not accept label_smoothing"):
        run(training.LossNode, ctx, type="MSELoss", label_smoothing=0.1)
    model = torch.nn.Linear(2, 2)
    opt = run(training.OptimizerNode, ctx, {"model": model}, type="SGD", lr=0.1, momentum=0.9)["optimizer"]
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    with pytest.raises(ValueError, match="does not accept nesterov"):
        run(training.OptimizerNode, ctx, {"model": model}, nesterov=True)


def test_training_loop_reduces_loss_and_reports_every_epoch(ctx: RunContext, events: Events,
                                                            tmp_path: Path) -> None:
    inputs, out = iris_training(ctx, epochs=3, checkpoint_every=1, checkpoint_every_steps=8,
                                tensorboard=True)
    losses = out["losses"].tolist()
    assert len(losses) == 3 and losses[-1] < losses[0]
    epochs = [p for p in events.of("progress") if p.get("event") == "epoch"]
    assert [p["epoch"] for p in epochs] == [1, 2, 3] and all("loss" in p for p in epochs)
    assert [m["step"] for m in events.of("metric") if m["name"] == "train_loss"] == [1, 2, 3]
    ckpts = tmp_path / "runs" / "run-1" / "checkpoints"
    assert {p.name for p in ckpts.iterdir()} == {"epoch-1.pt", "epoch-2.pt", "epoch-3.pt",
                                                "step-8.pt", "step-16.pt", "step-24.pt"}
    kinds = [(a["kind"], a["name"]) for a in events.of("artifact")]
    assert ("checkpoint", "epoch-3.pt") in kinds and ("tensorboard", "tensorboard") in kinds
    board = tmp_path / "runs" / "run-1" / "tensorboard"
    assert any(board.iterdir())
    assert torch.load(ckpts / "epoch-2.pt", weights_only=True)["epoch"] == 2
    assert out["metrics"]["total_epochs_run"] == 3 and out["model"] is inputs["model"]


def test_training_loop_logs_its_epoch_line_at_the_log_interval(ctx: RunContext, events: Events) -> None:
    """log_every_epochs thins the "Epoch N/M" lines (the first and last always shown); every epoch's metric
    and progress are recorded whatever it is. Its default, 0, logs every epoch up to 20 and about 20 lines
    beyond (400 epochs: every 20th)."""
    def epoch_lines() -> list[int]:
        return [int(p["message"].split()[1].split("/")[0]) for p in events.of("log")
                if p["message"].startswith("Epoch ")]
    iris_training(ctx, epochs=7, log_every_epochs=3)
    assert epoch_lines() == [1, 3, 6, 7]
    assert [m["step"] for m in events.of("metric") if m["name"] == "train_loss"] == [1, 2, 3, 4, 5, 6, 7]
    assert [p["epoch"] for p in events.of("progress") if p.get("event") == "epoch"] == [1, 2, 3, 4, 5, 6, 7]
    events.clear()
    iris_training(ctx, epochs=4)  # the default: every epoch
    assert epoch_lines() == [1, 2, 3, 4]
    from cdui.nodes.builtin.training_loop import epoch_log_every
    assert [epoch_log_every(0, n) for n in (1, 20, 21, 400, 1000)] == [1, 1, 2, 20, 50]
    assert epoch_log_every(5, 400) == 5
    param = next(p for p in TrainingLoopNode.define_params() if p.name == "log_every_epochs")
    assert (param.default, param.min_value) == (0, 0)


def test_training_loop_stop_saves_interrupt_checkpoint(tmp_path: Path) -> None:
    stop = threading.Event()
    events = Events()

    def emit(kind: str, payload: dict[str, Any]) -> None:
        events(kind, payload)
        if kind == "progress" and payload.get("event") == "epoch" and payload["epoch"] == 1:
            stop.set()  # the user presses Stop during epoch 2's first batch poll

    ctx = RunContext("run-2", Layout.for_data_dir(tmp_path), emit=emit, stop_event=stop)
    with pytest.raises(RunStopped):
        iris_training(ctx, epochs=5)
    path = tmp_path / "runs" / "run-2" / "checkpoints" / "interrupt.pt"
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["epoch"] == 1 and "model_state_dict" in ckpt and "optimizer_state_dict" in ckpt
    assert ("checkpoint", "interrupt.pt") in [(a["kind"], a["name"]) for a in events.of("artifact")]


def test_checkpoint_round_trip_resumes_training(ctx: RunContext, tmp_path: Path) -> None:
    inputs, out = iris_training(ctx, epochs=2)
    saved = run(fileio.CheckpointSaverNode, ctx, {"model": out["model"], "optimizer": inputs["optimizer"],
                                                  "losses": out["losses"]}, path="ck/iris.pt", epoch=2)
    assert Path(saved["path"]) == tmp_path / "models" / "ck" / "iris.pt"
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    opt = run(training.OptimizerNode, ctx, {"model": model}, lr=0.01)["optimizer"]
    back = run(fileio.CheckpointLoaderNode, ctx, {"model": model, "optimizer": opt}, path="ck/iris.pt")
    assert back["epoch"] == 2 and back["losses"].tolist() == out["losses"].tolist()
    assert torch.equal(model.state_dict()["layers.l1.weight"], out["model"].state_dict()["layers.l1.weight"])
    assert back["optimizer"].state  # Adam moments restored
    resumed = run(TrainingLoopNode, ctx, {**inputs, "model": back["model"], "optimizer": back["optimizer"],
                                          "start_epoch": back["epoch"]}, epochs=3, device="cpu")
    assert resumed["metrics"]["start_epoch"] == 2 and len(resumed["losses"]) == 1


def test_training_loop_options(ctx: RunContext, tmp_path: Path) -> None:
    _, out = iris_training(ctx, epochs=10, accumulate_steps=3, max_steps=5, precision="bf16",
                           grad_clip_norm=1.0)
    assert out["metrics"]["optimizer_steps"] == 5 and out["metrics"]["precision"] == "bf16"
    assert not (tmp_path / "runs").exists()  # nothing asked for files, nothing written
    split = iris_split(ctx)
    train = run(datasets.TensorDatasetNode, ctx, {"features": split["x_train"], "labels": split["y_train"]})
    val = run(datasets.TensorDatasetNode, ctx, {"features": split["x_test"], "labels": split["y_test"],
                                                "classes": train["classes"]})
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    opt = run(training.OptimizerNode, ctx, {"model": model}, lr=0.05)["optimizer"]
    out = run(TrainingLoopNode, ctx, {
        "model": model, "optimizer": opt, "loss_fn": run(training.LossNode, ctx)["loss_fn"],
        "dataloader": run(datasets.DataLoaderNode, ctx, {"dataset": train["dataset"]}, batch_size=16)["dataloader"],
        "val_dataloader": run(datasets.DataLoaderNode, ctx, {"dataset": val["dataset"]})["dataloader"],
        "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    }, epochs=40, early_stopping_patience=2, monitor="val_accuracy", device="cpu")
    assert out["metrics"]["stopped_early"] and out["metrics"]["total_epochs_run"] < 40
    assert out["metrics"]["lr_history"][:3] == [0.05, 0.05, 0.025] and len(out["val_losses"]) > 0


def test_training_loop_on_cuda_uses_the_card_or_falls_back(ctx: RunContext, events: Events) -> None:
    """Asking for cuda trains on the card where there is one; where there is
    none, the run falls back to the CPU with a warning instead of failing."""
    _, out = iris_training(ctx, epochs=1, device="cuda")
    trained_on = next(out["model"].parameters()).device.type
    fallbacks = [w for w in events.of("run_warning") if w["kind"] == "device_fallback"]
    if torch.cuda.is_available():
        assert trained_on == "cuda" and fallbacks == []
    else:
        assert trained_on == "cpu"
        assert fallbacks == [{"node_id": "trainingloop", "kind": "device_fallback",
                              "message": "device 'cuda' is not available on this machine; using 'cpu'",
                              "requested": "cuda", "used": "cpu"}]


def test_training_loop_on_a_card_this_process_lacks_falls_back(ctx: RunContext, events: Events) -> None:
    """A run's process sees only its own card, so a graph naming a card number
    past the ones visible here falls back (on machines with and without CUDA)."""
    missing = f"cuda:{torch.cuda.device_count()}"
    _, out = iris_training(ctx, epochs=1, device=missing)
    assert next(out["model"].parameters()).device.type == "cpu"
    assert [w for w in events.of("run_warning") if w["kind"] == "device_fallback"] == [
        {"node_id": "trainingloop", "kind": "device_fallback",
         "message": f"device {missing!r} is not available on this machine; using 'cpu'",
         "requested": missing, "used": "cpu"}]


def test_inference_and_tensor_dataset(ctx: RunContext) -> None:
    model = torch.nn.Linear(4, 3)
    out = run(training.InferenceNode, ctx, {"model": model, "input": torch.randn(2, 4)})
    assert out["output"].shape == (2, 3) and not out["output"].requires_grad and not model.training
    ds = run(datasets.TensorDatasetNode, ctx, {"features": torch.zeros(3, 2), "labels": ["b", "a", "b"]})
    assert ds["classes"] == ["a", "b"] and ds["dataset"][0][1].item() == 1
    val = run(datasets.TensorDatasetNode, ctx, {"features": torch.zeros(1, 2), "labels": ["b"],
                                                "classes": ds["classes"]})
    assert val["dataset"][0][1].item() == 1
    reg = run(datasets.TensorDatasetNode, ctx, {"features": torch.zeros(2, 2), "labels": torch.tensor([0.5, 1.5])})
    assert reg["dataset"][1][1].dtype == torch.float32
    loader = run(datasets.DataLoaderNode, ctx, {"dataset": ds["dataset"]}, batch_size=2, shuffle=False)
    assert [len(b[0]) for b in loader["dataloader"]] == [2, 1]


# -- files --------------------------------------------------------------------------------
def test_model_saver_writes_under_models_and_loader_reads_back(ctx: RunContext, events: Events,
                                                               tmp_path: Path) -> None:
    model = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    out = run(fileio.ModelSaverNode, ctx, {"model": model}, path="iris/model.pt")
    assert Path(out["path"]) == tmp_path / "models" / "iris" / "model.pt" and Path(out["path"]).is_file()
    assert events.of("artifact")[-1]["kind"] == "model"
    fresh = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    loaded = run(fileio.ModelLoaderNode, ctx, {"model": fresh}, path="iris/model.pt")["model"]
    x = torch.randn(3, 4)
    assert torch.equal(loaded(x), model(x))
    st = run(fileio.ModelSaverNode, ctx, {"model": model}, path="iris/model.pt", format="safetensors")
    assert st["path"].endswith("iris/model.safetensors")
    fresh = run(layers.SequentialModelNode, ctx, layers=MLP)["model"]
    loaded = run(fileio.ModelLoaderNode, ctx, {"model": fresh}, path="data/models/iris/model.safetensors")
    assert torch.equal(loaded["model"](x), model(x))
    run(fileio.ModelSaverNode, ctx, {"model": model}, path="full.pt", save_mode="full_model")
    whole = run(fileio.ModelLoaderNode, ctx, path="full.pt", load_mode="full_model")["model"]
    assert torch.equal(whole(x), model(x))


def test_paths_that_escape_their_folder_are_refused(ctx: RunContext, tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    with pytest.raises(PathRefused):
        run(fileio.ModelSaverNode, ctx, {"model": model}, path="../x.pt")
    with pytest.raises(PathRefused):
        run(fileio.ImageWriterNode, ctx, {"image": torch.zeros(3, 2, 2)}, path="../../x.png")
    with pytest.raises(PathRefused):
        run(data.CSVReaderNode, ctx, path="../x.csv")
    with pytest.raises(PathRefused):
        run(fileio.ModelLoaderNode, ctx, {"model": model}, path="data/models/../../x.pt")
    with pytest.raises(PathRefused):
        run(fileio.ImageReaderNode, ctx, path="/etc/passwd")
    assert not (tmp_path.parent / "x.pt").exists()


def test_image_writer_and_reader_round_trip(ctx: RunContext, events: Events, tmp_path: Path) -> None:
    img = torch.rand(3, 5, 7)
    out = run(fileio.ImageWriterNode, ctx, {"image": img}, path="pics/a")
    assert Path(out["path"]) == tmp_path / "output" / "pics" / "a.png"
    assert events.of("artifact")[-1]["kind"] == "output"
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(Path(out["path"]).read_bytes())
    back = run(fileio.ImageReaderNode, ctx, path="a.png")
    assert back["image"].shape == (3, 5, 7) and (back["tensor"] - img).abs().max() <= 0.5 / 255 + 1e-6
    grey = run(fileio.ImageReaderNode, ctx, path="a.png", mode="L", resize=4)["tensor"]
    assert grey.shape == (1, 4, 4)
    bmp = run(fileio.ImageWriterNode, ctx, {"image": img[:1]}, path="b.bmp", format="BMP")
    (tmp_path / "images" / "b.bmp").write_bytes(Path(bmp["path"]).read_bytes())
    back = run(fileio.ImageReaderNode, ctx, path="data/images/b.bmp", mode="RGB")["tensor"]
    assert back.shape == (3, 5, 7) and (back[1] - img[0]).abs().max() <= 0.5 / 255 + 1e-6


def test_file_reader_and_image_folder_dataset(ctx: RunContext, tmp_path: Path) -> None:
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "n.csv").write_text("a,b\n1,2\n3,4\n")
    out = run(fileio.FileReaderNode, ctx, path="n.csv", mode="csv")
    assert out["text"].startswith("a,b") and out["tensor"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert "cdui" in run(fileio.FileReaderNode, ctx, path="examples/custom_nodes/hello_node.py")["text"]

    for cls, value in (("cat", 0.2), ("dog", 0.8)):
        for i in range(2):
            run(fileio.ImageWriterNode, ctx, {"image": torch.full((3, 4, 4), value)}, path=f"set/train/{cls}/{i}.png")
    ds = run(datasets.ImageFolderDatasetNode, ctx, path="output/set")
    assert ds["classes"] == ["cat", "dog"] and len(ds["dataset"]) == 4
    image, label = ds["dataset"][3]
    assert image.shape == (3, 4, 4) and label == 1 and abs(image.mean().item() - 0.8) < 0.01
    with pytest.raises(ValueError, match="'val' sub-directory"):
        run(datasets.ImageFolderDatasetNode, ctx, path="output/set", split="val")


# -- compose, notify, custom nodes ------------------------------------------------------------
def test_map_runs_the_preset_once_per_item(ctx: RunContext) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def run_preset(name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        calls.append((name, inputs))
        return {"y": inputs[compose.FIRST_PORT] * 10}

    ctx.run_preset = run_preset
    out = run(compose.MapNode, ctx, {"items": [1, 2, 3]}, subgraph="times ten")
    assert out == {"results": [10, 20, 30], "count": 3.0} and calls[0] == ("times ten", {"": 1})
    ctx.stop_event.set()
    with pytest.raises(RunStopped):
        run(compose.MapNode, ctx, {"items": [1]}, subgraph="times ten")


class _Hook(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[Any, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.seen.append((self.headers, body))
        status = {"/fail": 500, "/moved": 302}.get(self.path, 200)
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/elsewhere")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_server(monkeypatch: pytest.MonkeyPatch):
    _Hook.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # A loopback target is this machine's own service: allowed here by its port (tests/test_netguard.py).
    monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", str(server.server_address[1]))
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_webhook_sends_the_secret_only_in_its_header(ctx: RunContext, events: Events, hook_server: str) -> None:
    out = run(notify.WebhookNode, ctx, {"value": torch.tensor([1.0, 2.0])}, url=hook_server + "/hook",
              api_key="s3cret-key", message="done")
    assert out["status"] == 200 and json.loads(out["response"]) == {"ok": True}
    headers, body = _Hook.seen[-1]
    assert headers["Authorization"] == "Bearer s3cret-key"
    payload = json.loads(body)
    assert payload["message"] == "done" and payload["run_id"] == "run-1"
    assert payload["value"]["values"] == [1.0, 2.0] and "s3cret-key" not in body.decode()
    run(notify.WebhookNode, ctx, url=hook_server + "/x", api_key="k2", auth_header="X-API-Key", auth_scheme="")
    assert _Hook.seen[-1][0]["X-API-Key"] == "k2"
    out = run(notify.WebhookNode, ctx, url=hook_server + "/fail", api_key="s3cret-key", fail_on_error=False)
    assert out["status"] == 500 and events.of("run_warning")[-1]["kind"] == "webhook_failed"
    with pytest.raises(RuntimeError, match="HTTP 500"):
        run(notify.WebhookNode, ctx, url=hook_server + "/fail", api_key="s3cret-key")
    sent = len(_Hook.seen)
    with pytest.raises(RuntimeError, match="HTTP 302"):  # a redirect is not followed
        run(notify.WebhookNode, ctx, url=hook_server + "/moved", api_key="s3cret-key")
    assert len(_Hook.seen) == sent + 1
    assert "s3cret-key" not in json.dumps(list(events))
    assert notify.WebhookNode.define_params()[2].param_type == "secret"


def test_hello_node_example_loads_as_a_custom_node(ctx: RunContext) -> None:
    registry = Registry()
    registry.load_custom_dir(EXAMPLES / "custom_nodes")
    assert registry.load_errors == []
    assert run(registry.get("HelloNode"), ctx) == {"value": "Hello, world!"}
    assert run(registry.get("HelloNode"), ctx, name="cdui") == {"value": "Hello, cdui!"}


# -- whole graphs -------------------------------------------------------------------------------
def test_codefyui_iris_examples_run_unchanged(ctx: RunContext, events: Events) -> None:
    registry = build_registry()
    knn = json.loads((CODEFYUI_EXAMPLES / "Iris-Sklearn-KNN.graph.json").read_text(encoding="utf-8"))
    out = run_graph(knn, ctx, registry)
    assert len(out["print"]["value"]) == 30 and out["acc"]["correct"] == 28
    pipeline = json.loads((CODEFYUI_EXAMPLES / "Tabular-Iris-Pipeline.graph.json").read_text(encoding="utf-8"))
    means = run_graph(pipeline, ctx, registry)["print"]["value"]
    assert means.shape == (4,) and means.abs().max().item() < 0.03


def test_iris_train_example_trains_and_saves(ctx: RunContext, tmp_path: Path) -> None:
    torch.manual_seed(0)
    graph = json.loads((EXAMPLES / "iris_train.json").read_text())
    assert graph["format_version"] == 1
    out = run_graph(graph, ctx, build_registry())
    assert (tmp_path / "models" / "iris" / "model.pt").is_file()
    losses = out["train"]["losses"]
    assert losses[-1] < losses[0] and out["train"]["metrics"]["final_val_loss"] < 0.5
