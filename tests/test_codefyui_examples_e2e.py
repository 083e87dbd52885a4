"""CodefyUI's example graphs, unchanged, as real runs: the 20 that need the
whole node library through cdui's executor in this process with each result
checked, two submitted to a real control plane process (its run subprocess),
and those 20 and Toy-Sampling on one real agent process enrolled with a token
(the agent counts as another machine, with the datasets in its own data folder).

The datasets are tiny copies in torchvision's layouts (tests/codefyui_example_data.py);
the graphs are as exported, epochs included."""
from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.graph.executor import Executor
from cdui.graph.presets import preset_library
from cdui.graph.validate import validate_graph
from cdui.nodes.registry import build_registry
from codefyui_example_data import (
    CNN_WEIGHTS,
    DIGIT_PIXELS,
    SAMPLES,
    cnn_forward,
    digit_png,
    example,
    write_example_data,
)
from procs import Proc, ServerProc, env_for, wait_for, wait_run

pytestmark = pytest.mark.e2e

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Printed shapes of the architecture examples, as their notes and descriptions give them.
ARCHITECTURES = {
    "BERT-Encoder-Transformer": ("print_logits", (2, 2)),
    "BiGRU-SpeechRecognition-RNN": ("print_logits", (2, 32, 50)),
    "ConvNeXt-CNN": ("print_logits", (2, 10)),
    "DQN-Atari-RL": ("print-action", (2, 4)),
    "DiT-Diffusion-Transformer": ("print_eps", (2, 16, 64)),
    "EfficientNet-CNN": ("print_logits", (2, 10)),
    "GPT-DecoderOnly-Transformer": ("print_logits", (2, 10)),
    "LLaMA-Decoder-Transformer": ("print_logits", (2, 32)),
    "PPO-Robotics-RL": ("print-action", (2, 17)),
    "ResNet-SkipConnection-CNN": ("print_logits", (2, 10)),
    "Seq2Seq-Attention-RNN": ("print_logits", (2, 8, 64)),
    "SwinTransformer-Transformer": ("print_logits", (2, 10)),
    "TimeSeries-LSTM-RNN": ("print_forecast", (2, 1)),
    "UNet-Segmentation-CNN": ("print", (1, 1, 32, 32)),
    "ViT-ImageClassifier-Transformer": ("print_logits", (2, 10)),
}
# The examples vendored with CodefyUI's whole node library: the others run in process in
# tests/test_codefyui_examples.py, and Toy-Sampling stands for them on the agent (each run on
# the agent is a fresh interpreter, so the CI time grows with every graph).
NEW_EXAMPLES = [*ARCHITECTURES, "TrainCNN-MNIST", "InferenceCNN-MNIST", "TrainGPT-Mini", "TrainResNet-CIFAR10",
                "Word-Embedding-Analogy"]
# TrainCNN-MNIST writes the weights InferenceCNN-MNIST reads, so that one goes last.
ON_THE_AGENT = sorted([*NEW_EXAMPLES, "Toy-Sampling"], key=lambda n: n == "InferenceCNN-MNIST")


def log_messages(cp: ServerProc, run_id: str) -> list[str]:
    return [str(e["data"].get("message", "")) for e in cp.events(run_id) if e["kind"] == "log"]


def is_png(image: str) -> bool:
    return base64.b64decode(image).startswith(PNG_MAGIC)


def test_the_new_examples_run_in_process_with_the_expected_results(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="EmbeddingScatter needs the classical extra (scikit-learn)")
    pytest.importorskip("matplotlib", reason="Visualize needs the plots extra (matplotlib)")
    pytest.importorskip("PIL.Image", reason="ImageReader needs the vision extra (Pillow)")
    write_example_data(tmp_path)
    registry, layout = build_registry(), Layout.for_data_dir(tmp_path)

    def run(name: str) -> dict[str, dict[str, Any]]:
        plan, errors = validate_graph(example(name), registry, preset_library(), layout=layout)
        assert errors == [] and plan is not None, (name, errors)
        return Executor(registry, RunContext(f"run-{name}", layout, emit=lambda kind, data: None)).run(plan)

    for name, (node_id, shape) in ARCHITECTURES.items():
        value = run(name)[node_id]["value"]
        assert tuple(value.shape) == shape and bool(torch.isfinite(value).all()), (name, tuple(value.shape))

    out = run("TrainCNN-MNIST")
    assert out["train-pipeline__train_loop"]["losses"].shape == (5,)  # its 5 epochs
    assert out["eval"]["total"] == SAMPLES and out["print-accuracy"]["value"] == out["eval"]["correct"] / SAMPLES
    assert out["print-predictions"]["value"].shape == (16,)
    assert is_png(out["visualize-loss"]["image"]) and is_png(out["show-digits"]["image"])
    weights = torch.load(tmp_path / "models" / "model_weights.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in weights.items()} == CNN_WEIGHTS

    out = run("InferenceCNN-MNIST")
    pixels = torch.tensor(list(DIGIT_PIXELS), dtype=torch.float32).reshape(1, 1, 28, 28) / 255.0
    want = cnn_forward(weights, (pixels - 0.5) * 2.0)
    assert torch.allclose(out["print-output"]["value"], want, atol=1e-5)
    assert torch.equal(out["print-digit"]["value"], want.argmax(dim=-1))
    assert torch.allclose(out["print-probs"]["value"].sum(), torch.tensor(1.0))

    for name, epochs in (("TrainGPT-Mini", 3), ("TrainResNet-CIFAR10", 3)):
        out = run(name)
        losses = out["train-pipeline__train_loop"]["losses"]
        assert losses.shape == (epochs,) and bool(torch.isfinite(losses).all()), name
        assert is_png(out["visualize-loss"]["image"]), name

    out = run("Word-Embedding-Analogy")
    assert out["print_top"]["value"][0][0] == "queen"


@pytest.fixture
def cp(tmp_path: Path):
    s = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1",
                                        # two runs at once on the agent: 21 graphs, each a fresh interpreter
                                        "CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "w1/cpu=2"}).start()
    yield s
    s.stop()


def test_examples_run_to_succeeded_on_the_control_plane(cp: ServerProc) -> None:
    for name in ("RLHF-Reward-and-KL", "Mini-UNet-Compact"):
        run = cp.submit(example(name), {"target": "local"})
        done = wait_run(cp, run["id"])
        assert done["status"] == "succeeded", (name, done)
    messages = log_messages(cp, run["id"])
    assert any(m.startswith("[Compact U-Net output (1-step denoise)] tensor(") for m in messages), messages


@pytest.mark.long
@pytest.mark.timeout(1200)  # 21 fresh run interpreters on a machine other suites share
def test_the_examples_run_to_succeeded_on_a_real_agent(cp: ServerProc, tmp_path: Path) -> None:
    pytest.importorskip("PIL.Image", reason="test_digit.png is written with Pillow (the vision extra)")
    # The datasets are on the worker's machine (Dataset reads the machine that runs the
    # graph); the image is an upload of the control plane, sent with the run.
    write_example_data(tmp_path / "agent-data", images=False)
    assert cp.upload("images", "test_digit.png", digit_png())[0] == 201
    token = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", cp.url, "--token", token,
                  "--name", "w1", "--devices", "cpu", "--foreground"],
                 env_for(tmp_path / "agent", tmp_path / "agent-data", {"CODEFYUI_MACHINE_ID": "another-machine"}),
                 tmp_path / "agent.log", name="agent-w1")
    agent.spawn()
    try:
        def online() -> bool:
            if not agent.alive:
                raise AssertionError(f"agent exited {agent.returncode}:\n{agent.log_tail(30)}")
            return any(w["name"] == "w1" and w["online"] for w in cp.call("GET", "/api/workers", expect=200)["workers"])
        wait_for(online, 120, 0.2, "worker w1 online")
        target = {"target": {"worker": "w1"}}
        first = {name: cp.submit(example(name), target)["id"] for name in ON_THE_AGENT[:-1]}
        ended = {name: wait_run(cp, run_id, timeout=900) for name, run_id in first.items()}
        # after TrainCNN-MNIST saved model_weights.pt
        last = cp.submit(example(ON_THE_AGENT[-1]), target)["id"]
        ended[ON_THE_AGENT[-1]] = wait_run(cp, last, timeout=300)
        outcome = {name: (run["status"], run["worker_id"]) for name, run in ended.items()}
        assert outcome == {name: ("succeeded", "w1") for name in ON_THE_AGENT}, \
            {name: (run["status"], run.get("error")) for name, run in ended.items() if run["status"] != "succeeded"}
        assert any(m.startswith("[Predicted digit] tensor([") for m in log_messages(cp, last))
        assert any(m.startswith("[Final x_0 (untrained → noise)] tensor(")
                   for m in log_messages(cp, first["Toy-Sampling"]))
        assert any(m == "[Top-k labels (excluding self)] [['queen', 'duchess', 'princess', 'mother', 'goddess']]"
                   for m in log_messages(cp, first["Word-Embedding-Analogy"])), \
            log_messages(cp, first["Word-Embedding-Analogy"])
    finally:
        agent.stop()
