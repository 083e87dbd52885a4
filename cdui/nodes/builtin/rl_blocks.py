"""CodefyUI's RLHF building blocks: the KL divergence between two
distributions and the seeded reward head."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import MODEL, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, I, T, int_param

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

RL = "RL"
# Bounds on the reward head, so a typo cannot allocate gigabytes of weights.
MAX_REWARD_WIDTH = 65536


class KLDivergenceNode(DeclaredNode):
    NODE_NAME, CATEGORY = "KLDivergence", RL
    DESCRIPTION = "KL(p || q) over the last dim, from probabilities or logits"
    INPUTS = (T("p", "The distribution (policy)"), T("q", "The reference distribution"))
    OUTPUTS = (T("kl", "The divergence, reduced as asked"),)
    PARAMS = (Param("input_kind", "select", "probs", "What p and q hold", options=["probs", "logits"]),
              Param("reduction", "select", "batchmean", "How the per-element terms are combined",
                    options=["batchmean", "sum", "mean", "none"]))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn.functional as functional

        p, q = self.float_tensor(inputs, "p"), self.float_tensor(inputs, "q")
        if p.shape != q.shape:
            raise ValueError(f"KLDivergence: p {tuple(p.shape)} and q {tuple(q.shape)} must have the same shape")
        kind = str(params.get("input_kind") or "probs")
        reduction = str(params.get("reduction") or "batchmean")
        if kind not in ("probs", "logits"):
            raise ValueError(f"KLDivergence: unknown input_kind {kind!r}")
        if reduction not in ("batchmean", "sum", "mean", "none"):
            raise ValueError(f"KLDivergence: unknown reduction {reduction!r}")
        if kind == "logits":
            target, log_q = functional.softmax(p, dim=-1), functional.log_softmax(q, dim=-1)
        else:
            target, log_q = p, q.clamp_min(1e-12).log()
        # F.kl_div(input=log q, target=p) is sum p * (log p - log q) = KL(p || q).
        if reduction == "none":
            # One value per sample: the terms summed over the distribution's dim.
            return {"kl": functional.kl_div(log_q, target, reduction="none").sum(-1)}
        if reduction == "mean":
            # The mean over every element, as torch's "mean" gives, without its deprecation warning.
            return {"kl": functional.kl_div(log_q, target, reduction="none").mean()}
        return {"kl": functional.kl_div(log_q, target, reduction=reduction)}


def build_reward_head(input_dim: int, hidden_dim: int, seed: int) -> Any:
    """Linear(input_dim, hidden_dim) -> ReLU -> Linear(hidden_dim, 1) under ``net``
    (keys net.0.*, net.2.*), every weight and bias drawn from U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) by a generator seeded with ``seed``."""
    import torch
    import torch.nn as nn

    class RewardHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1))

        def forward(self, h: Any) -> Any:
            # A sequence is scored by its last time step.
            if h.dim() == 3:
                h = h[:, -1, :]
            return self.net(h).squeeze(-1)

    head = RewardHead()
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear):
                bound = 1.0 / math.sqrt(module.in_features)
                module.weight.copy_((torch.rand(module.weight.shape, generator=gen) * 2 - 1) * bound)
                module.bias.copy_((torch.rand(module.bias.shape, generator=gen) * 2 - 1) * bound)
    return head


class RewardModelNode(DeclaredNode):
    NODE_NAME, CATEGORY = "RewardModel", RL
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Seeded MLP reward head: one scalar per item of [B, H] (or the last step of [B, T, H])"
    INPUTS = (T("hidden_states", "Hidden states [B, H] or [B, T, H]; rewards is empty without them",
                optional=True),)
    OUTPUTS = (Port("model", MODEL, "The reward head (nn.Module)"), T("rewards", "Reward per item, [B]"))
    PARAMS = (I("input_dim", 128, "Hidden-state width H", lo=1), I("hidden_dim", 64, "Inner width", lo=1),
              I("seed", 42, "Seed of the weights"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        in_dim, hidden = int_param(params, "input_dim", 128), int_param(params, "hidden_dim", 64)
        if not (1 <= in_dim <= MAX_REWARD_WIDTH and 1 <= hidden <= MAX_REWARD_WIDTH):
            raise ValueError(f"RewardModel: input_dim and hidden_dim must be within 1..{MAX_REWARD_WIDTH}")
        head = build_reward_head(in_dim, hidden, int_param(params, "seed", 42))
        if inputs.get("hidden_states") is None:
            return {"model": head, "rewards": torch.zeros(0)}
        h = self.float_tensor(inputs, "hidden_states")
        if h.dim() not in (2, 3):
            raise ValueError(f"RewardModel: hidden_states {tuple(h.shape)} must be [B, H] or [B, T, H]")
        if h.shape[-1] != in_dim:
            # A width the head's weights do not take is torch's RuntimeError in CodefyUI too.
            raise RuntimeError(f"RewardModel: hidden_states {tuple(h.shape)} do not fit input_dim={in_dim}; "
                               f"set input_dim to {h.shape[-1]}")
        head = head.to(h.device)
        with torch.no_grad():
            rewards = head(h)
        return {"model": head, "rewards": rewards}
