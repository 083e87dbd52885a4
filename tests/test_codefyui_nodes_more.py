"""Table tests of the second part of CodefyUI's node library (diffusion,
RLHF, LLM blocks, data flow and inputs): each node against small tensors
with a result known independently (torch.nn / torch.nn.functional or
arithmetic done here), run through the real registry."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as functional

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.nodes.registry import Registry, build_registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    return build_registry()


@pytest.fixture
def ctx(tmp_path: Path) -> RunContext:
    return RunContext("run-1", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)


def run(registry: Registry, type_name: str, ctx: RunContext, inputs: dict[str, Any] | None = None,
        **params: Any) -> dict[str, Any]:
    cls = registry.get(type_name)
    assert cls is not None, type_name
    merged = {p.name: p.default for p in cls.define_params()}
    merged.update(params)
    return cls().execute(inputs or {}, merged, ctx)


# -- Diffusion ---------------------------------------------------------------------------------------
def test_gaussian_noise_is_the_seeded_draw_scaled_and_shifted(registry: Registry, ctx: RunContext) -> None:
    out = run(registry, "GaussianNoise", ctx, shape="2,3", mean=1.0, std=0.5, seed=7)["noise"]
    want = torch.randn((2, 3), generator=torch.Generator().manual_seed(7)) * 0.5 + 1.0
    assert torch.equal(out, want)
    ref = torch.zeros(4, 1, 5)
    assert run(registry, "GaussianNoise", ctx, {"shape_ref": ref}, shape="1")["noise"].shape == (4, 1, 5)


@pytest.mark.parametrize("shape", ["", "1,x", "0,3", "1,3,100000,100000"])
def test_gaussian_noise_refuses_bad_or_huge_shapes(registry: Registry, ctx: RunContext, shape: str) -> None:
    with pytest.raises(ValueError, match="GaussianNoise"):
        run(registry, "GaussianNoise", ctx, shape=shape)


def test_lerp_weights_a_by_alpha_from_param_or_input(registry: Registry, ctx: RunContext) -> None:
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])
    assert torch.allclose(run(registry, "Lerp", ctx, {"tensor_a": a, "tensor_b": b}, alpha=0.75)["tensor"],
                          torch.tensor([1.5, 3.0]))
    wired = run(registry, "Lerp", ctx, {"tensor_a": a, "tensor_b": b, "alpha": torch.tensor(0.0)}, alpha=0.75)
    assert torch.equal(wired["tensor"], b)


def test_timestep_embedding_is_sinusoids_through_the_seeded_mlp(registry: Registry, ctx: RunContext) -> None:
    t = torch.tensor([0.0, 50.0])
    out = run(registry, "TimestepEmbedding", ctx, {"timestep": t}, embed_dim=8, max_period=100, seed=3)["embedding"]
    gen = torch.Generator().manual_seed(3)
    w1 = torch.randn((32, 8), generator=gen) / math.sqrt(8)
    w2 = torch.randn((8, 32), generator=gen) / math.sqrt(8)
    freqs = torch.exp(-math.log(100) * torch.arange(4, dtype=torch.float32) / 4)
    args = t.unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    assert out.shape == (2, 8)
    assert torch.allclose(out, functional.silu(emb @ w1.T) @ w2.T, atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        run(registry, "TimestepEmbedding", ctx, {"timestep": t}, embed_dim=7)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "area"])
def test_upsample_matches_interpolate_and_keeps_the_dtype(registry: Registry, ctx: RunContext, mode: str) -> None:
    x = torch.arange(16, dtype=torch.float64).reshape(1, 1, 4, 4)
    out = run(registry, "Upsample", ctx, {"tensor": x}, mode=mode, scale_factor=2.0)["tensor"]
    extra = {"align_corners": False} if mode == "bilinear" else {}
    assert out.dtype == torch.float64
    assert torch.equal(out, functional.interpolate(x.float(), scale_factor=2.0, mode=mode, **extra).double())


def test_diffusion_unet_keeps_codefyuis_keys_and_the_input_shape(registry: Registry, ctx: RunContext) -> None:
    model = run(registry, "DiffusionUNet", ctx, base_channels=8, channel_mult="1,2", num_groups=4)["model"]
    keys = set(model.state_dict())
    assert {"time_mlp.fc1.weight", "time_mlp.fc2.bias", "stem.weight", "head.weight",
            "down_blocks.0.conv1.weight", "down_blocks.0.time_proj.weight", "down_blocks.0.norm2.bias",
            "bottleneck.skip.weight", "up_blocks.0.skip.weight"} <= keys
    # The first down block keeps its width (8 -> 8), so it has no 1x1 skip conv.
    assert "down_blocks.0.skip.weight" not in keys
    x = torch.randn(2, 3, 8, 8)
    assert model(x, torch.tensor([5, 5])).shape == (2, 3, 8, 8)
    again = run(registry, "DiffusionUNet", ctx, base_channels=8, channel_mult="1,2", num_groups=4)["model"]
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="num_groups"):
        run(registry, "DiffusionUNet", ctx, base_channels=6, num_groups=4)


def test_ddpm_sampler_one_step_is_the_posterior_mean(registry: Registry, ctx: RunContext) -> None:
    class ConstantNoise(torch.nn.Module):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            assert t.dtype == torch.long and t.tolist() == [0] * x.shape[0]
            return torch.ones_like(x)

    x_t = torch.full((1, 1, 2, 2), 2.0)
    out = run(registry, "DDPMSampler", ctx, {"model": ConstantNoise(), "noise": x_t}, num_steps=1,
              beta_start=0.1, beta_end=0.1)["image"]
    # alpha = 0.9, alpha_bar = 0.9: x_0 = (x_t - 0.1 / sqrt(0.1) * eps) / sqrt(0.9)
    want = (2.0 - 0.1 / math.sqrt(0.1)) / math.sqrt(0.9)
    assert torch.allclose(out, torch.full_like(x_t, want))


def test_ddpm_sampler_adds_seeded_noise_between_steps(registry: Registry, ctx: RunContext) -> None:
    class Zero(torch.nn.Module):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(x)

    x_t = torch.zeros(1, 3)
    out = run(registry, "DDPMSampler", ctx, {"model": Zero(), "noise": x_t}, num_steps=2, beta_start=0.1,
              beta_end=0.2, seed=5)["image"]
    z = torch.randn((1, 3), generator=torch.Generator().manual_seed(5))
    # t=1: x = 0 + sqrt(0.2) z; t=0: x = x / sqrt(0.9)
    assert torch.allclose(out, math.sqrt(0.2) * z / math.sqrt(0.9))


# -- RL ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
def test_kl_divergence_matches_the_formula(registry: Registry, ctx: RunContext, reduction: str) -> None:
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    terms = p * (p.log() - q.log())
    want = {"batchmean": terms.sum() / 2, "sum": terms.sum(), "mean": terms.mean()}[reduction]
    out = run(registry, "KLDivergence", ctx, {"p": p, "q": q}, reduction=reduction)["kl"]
    assert torch.allclose(out, want)


def test_kl_divergence_from_logits_and_per_sample(registry: Registry, ctx: RunContext) -> None:
    lp, lq = torch.tensor([[1.0, 2.0, 0.5]]), torch.zeros(1, 3)
    p = torch.softmax(lp, -1)
    want = (p * (p.log() - math.log(1 / 3))).sum(-1)
    out = run(registry, "KLDivergence", ctx, {"p": lp, "q": lq}, input_kind="logits", reduction="none")["kl"]
    assert out.shape == (1,) and torch.allclose(out, want)


def test_reward_model_scores_the_last_step_with_codefyuis_keys(registry: Registry, ctx: RunContext) -> None:
    h = torch.randn(3, 5, 4)
    out = run(registry, "RewardModel", ctx, {"hidden_states": h}, input_dim=4, hidden_dim=6, seed=1)
    model = out["model"]
    assert list(model.state_dict()) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    sd = model.state_dict()
    want = (torch.relu(h[:, -1] @ sd["net.0.weight"].T + sd["net.0.bias"]) @ sd["net.2.weight"].T
            + sd["net.2.bias"]).squeeze(-1)
    assert out["rewards"].shape == (3,) and torch.allclose(out["rewards"], want)
    assert run(registry, "RewardModel", ctx, input_dim=4)["rewards"].numel() == 0
    # a width the head does not take is torch's RuntimeError, as in CodefyUI
    with pytest.raises(RuntimeError, match="input_dim"):
        run(registry, "RewardModel", ctx, {"hidden_states": torch.randn(2, 3)}, input_dim=4)


# -- LLM ---------------------------------------------------------------------------------------------
def test_cosine_similarity_ranks_and_excludes(registry: Registry, ctx: RunContext) -> None:
    keys = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    out = run(registry, "CosineSimilarity", ctx, {"queries": torch.tensor([3.0, 0.1]), "keys": keys,
                                                   "key_labels": ["x", "y", "xy"]}, top_k=2, exclude_self_words="X")
    want = functional.cosine_similarity(torch.tensor([[3.0, 0.1]]), keys).unsqueeze(0)
    assert torch.allclose(out["similarity"], want)
    assert out["top_k_indices"] == [[2, 1]] and out["top_k_labels"] == [["xy", "y"]]


def test_attention_masks(registry: Registry, ctx: RunContext) -> None:
    causal = run(registry, "AttentionMask", ctx, {"tensor": torch.zeros(3, 2)})["mask"]
    assert torch.equal(causal, torch.tensor([[False, True, True], [False, False, True], [False, False, False]]))
    pad = run(registry, "AttentionMask", ctx, {"tokens": ["a", "<pad>", "b"]}, mode="padding")["mask"]
    assert torch.equal(pad, torch.tensor([[False, True, False]] * 3))


def test_positional_encoding_is_vaswanis_table(registry: Registry, ctx: RunContext) -> None:
    x = torch.zeros(3, 2, 4)
    out = run(registry, "PositionalEncoding", ctx, {"tensor": x})
    pe = out["pe"]
    assert pe.shape == (3, 4)
    assert pe[1, 0].item() == pytest.approx(math.sin(1.0)) and pe[1, 1].item() == pytest.approx(math.cos(1.0))
    assert pe[2, 2].item() == pytest.approx(math.sin(2 / 100.0))
    assert pe[2, 3].item() == pytest.approx(math.cos(2 / 100.0))
    assert torch.equal(out["tensor"], pe.unsqueeze(1).expand(3, 2, 4))
    with pytest.raises(ValueError, match="max_len"):
        run(registry, "PositionalEncoding", ctx, {"tensor": torch.zeros(5, 4)}, max_len=4)


# -- data flow and inputs ----------------------------------------------------------------------------
def test_switch_forwards_the_selected_input_or_input_0(registry: Registry, ctx: RunContext) -> None:
    ins = {"input_0": "zero", "input_2": "two"}
    assert run(registry, "Switch", ctx, {**ins, "selector": torch.tensor(2.0)})["output"] == "two"
    assert run(registry, "Switch", ctx, {**ins, "selector": 1})["output"] == "zero"
    assert run(registry, "Switch", ctx, ins)["output"] == "zero"


@pytest.mark.parametrize(("operation", "want"), [
    ("sum", [4.0, 6.0]), ("mean", [2.0, 3.0]), ("min", [1.0, 2.0]), ("max", [3.0, 4.0]),
    ("concat", [1.0, 2.0, 3.0, 4.0]), ("first", [1.0, 2.0]), ("last", [3.0, 4.0])])
def test_reduce(registry: Registry, ctx: RunContext, operation: str, want: list[float]) -> None:
    items = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    out = run(registry, "Reduce", ctx, {"items": items}, operation=operation)
    assert out["result"].tolist() == want and out["count"] == 2.0


def test_text_and_tensor_inputs(registry: Registry, ctx: RunContext) -> None:
    assert run(registry, "TextInput", ctx, value="hi")["text"] == "hi"
    rnd = run(registry, "TensorInput", ctx, shape="2,3", seed=4)["tensor"]
    assert torch.equal(rnd, torch.randn((2, 3), generator=torch.Generator().manual_seed(4)))
    grid = run(registry, "TensorInput", ctx, shape="2,2", dtype="int64", value_mode="explicit",
               values=[[1, 2], [3, 4]])["tensor"]
    assert grid.dtype == torch.int64 and grid.tolist() == [[1, 2], [3, 4]]
    assert run(registry, "TensorInput", ctx, shape="2,2", value_mode="arange")["tensor"].tolist() == \
        [[0.0, 1.0], [2.0, 3.0]]
    with pytest.raises(ValueError, match="elements"):
        run(registry, "TensorInput", ctx, shape="100000,100000")


def test_row_selector_by_position_and_name(registry: Registry, ctx: RunContext) -> None:
    x = torch.arange(6).reshape(3, 2)
    assert run(registry, "RowSelector", ctx, {"tensor": x}, indices="2,0")["tensor"].tolist() == [[4, 5], [0, 1]]
    named = run(registry, "RowSelector", ctx, {"tensor": x, "labels": ["a", "b", "c"]}, names="b")
    assert named["tensor"].tolist() == [[2, 3]]
    with pytest.raises(ValueError, match="outside"):
        run(registry, "RowSelector", ctx, {"tensor": x}, indices="3")


def test_backward_once_is_the_identity(registry: Registry, ctx: RunContext) -> None:
    x = torch.randn(2)
    assert run(registry, "BackwardOnce", ctx, {"tensor": x})["tensor"] is x


# -- reinforcement learning ----------------------------------------------------------------------------
def test_dqn_is_codefyuis_sequential_and_scores_the_state(registry: Registry, ctx: RunContext) -> None:
    state = torch.randn(2, 6)
    out = run(registry, "DQN", ctx, {"state": state}, state_dim=6, action_dim=3, hidden_dim=5)
    model = out["model"]
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    with torch.no_grad():
        assert torch.equal(out["action"], model(state))
    assert out["action"].shape == (2, 3)
    assert torch.equal(run(registry, "DQN", ctx, action_dim=3)["action"], torch.zeros(3))


def test_ppo_gives_a_policy_that_sums_to_one(registry: Registry, ctx: RunContext) -> None:
    out = run(registry, "PPO", ctx, {"state": torch.randn(4, 4)}, hidden_dim=8)
    keys = list(out["model"].state_dict())
    assert keys == ["shared.0.weight", "shared.0.bias", "shared.2.weight", "shared.2.bias", "actor.weight",
                    "actor.bias", "critic.weight", "critic.bias"]
    assert out["action"].shape == (4, 2) and torch.allclose(out["action"].sum(-1), torch.ones(4))


def env_graph(env_name: str) -> dict[str, Any]:
    return {"nodes": [{"id": "start", "type": "Start", "data": {"params": {}}},
                      {"id": "env", "type": "EnvWrapper", "data": {"params": {"env_name": env_name}}},
                      {"id": "print", "type": "Print", "data": {"params": {}}}],
            "edges": [{"source": "start", "sourceHandle": "trigger", "target": "env", "type": "trigger"},
                      {"source": "env", "sourceHandle": "observation", "target": "print", "targetHandle": "value"}]}


@pytest.mark.parametrize(("env_name", "package"), [("ALE/Breakout-v5", "ale-py"), ("Humanoid-v4", "mujoco")])
def test_simulator_environments_are_refused_at_validation_naming_the_package(
        registry: Registry, tmp_path: Path, env_name: str, package: str) -> None:
    from cdui.graph.presets import preset_library
    from cdui.graph.validate import validate_graph

    plan, errors = validate_graph(env_graph(env_name), registry, preset_library(), layout=Layout.for_data_dir(tmp_path))
    assert plan is None
    sim = [e for e in errors if f"needs {package} " in str(e)]
    assert len(sim) == 1, errors


def test_env_wrapper_makes_and_resets_cartpole(registry: Registry, ctx: RunContext) -> None:
    pytest.importorskip("gymnasium", reason="EnvWrapper needs the rl extra (gymnasium)")
    out = run(registry, "EnvWrapper", ctx, env_name="CartPole-v1")
    assert out["observation"].shape == (4,) and out["observation"].dtype == torch.float32
    assert out["env"].spec.id == "CartPole-v1"


# -- training extras -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "cls_name"), [("StepLR", "StepLR"), ("CosineAnnealingLR", "CosineAnnealingLR"),
                                                 ("MultiStepLR", "MultiStepLR"), ("OneCycleLR", "OneCycleLR"),
                                                 ("ReduceLROnPlateau", "ReduceLROnPlateau")])
def test_lr_scheduler_builds_torchs_scheduler(registry: Registry, ctx: RunContext, kind: str, cls_name: str) -> None:
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    sched = run(registry, "LRScheduler", ctx, {"optimizer": opt}, type=kind, step_size=2, gamma=0.5)["scheduler"]
    assert type(sched).__name__ == cls_name
    if kind == "StepLR":
        for _ in range(2):
            opt.step()
            sched.step()
        assert opt.param_groups[0]["lr"] == 0.5
    if kind == "MultiStepLR":
        assert sorted(sched.milestones) == [2, 4, 6, 8]


def test_evaluate_model_counts_argmax_hits(registry: Registry, ctx: RunContext) -> None:
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
    y = torch.tensor([0, 0, 0])
    out = run(registry, "EvaluateModel", ctx, {"model": model, "dataset": torch.utils.data.TensorDataset(x, y)},
              batch_size=2)
    assert (out["correct"], out["total"]) == (2.0, 3.0) and out["accuracy"] == pytest.approx(2 / 3)
    assert model.training
