"""CodefyUI's small Diffusion-family nodes: seeded noise, a linear blend,
the timestep embedding and a parameter-free upsample.

Noise and weights are drawn from a private ``torch.Generator`` seeded by the
node's ``seed`` param, never from torch's global generator, so the same
params give the same tensors in any graph and two such nodes in one level
cannot disturb each other's draws.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import Param
from cdui.nodes.builtin._declared import DeclaredNode, F, I, T, float_param, int_param

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

DIFFUSION = "Diffusion"
# The largest tensor GaussianNoise builds from its shape param: a typo such as
# "1,3,32000,32000" must be an error, not an allocation of gigabytes.
MAX_NOISE_ELEMENTS = 64 * 1024 * 1024


def parse_shape(node: str, text: Any) -> tuple[int, ...]:
    """A comma-separated list of positive dims, bounded in size."""
    parts = [p.strip() for p in str(text if text is not None else "").split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{node}: the shape param is empty; give comma-separated dims such as 1,3,8,8")
    if len(parts) > 8:
        raise ValueError(f"{node}: shape {text!r} has more than 8 dims")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{node}: shape {text!r} is not a list of comma-separated integers") from None
    if any(d <= 0 for d in dims):
        raise ValueError(f"{node}: every dim of shape {text!r} must be positive")
    if math.prod(dims) > MAX_NOISE_ELEMENTS:
        raise ValueError(f"{node}: shape {text!r} has more than {MAX_NOISE_ELEMENTS} elements")
    return dims


class GaussianNoiseNode(DeclaredNode):
    NODE_NAME, CATEGORY = "GaussianNoise", DIFFUSION
    CACHEABLE = False  # draws from the process's random generator
    DESCRIPTION = "Seeded normal noise N(mean, std^2), shaped like shape_ref or by the shape param"
    INPUTS = (T("shape_ref", "Tensor whose shape and device the noise takes; the shape param is then ignored",
                optional=True),)
    OUTPUTS = (T("noise", "Float32 noise"),)
    PARAMS = (Param("shape", "string", "1,3,8,8", "Comma-separated dims, used when shape_ref is not connected"),
              F("mean", 0.0, "Mean"), F("std", 1.0, "Standard deviation", lo=0.0),
              I("seed", 42, "Seed: the same seed gives the same noise"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        ref = inputs.get("shape_ref")
        if isinstance(ref, torch.Tensor):
            if ref.numel() > MAX_NOISE_ELEMENTS:
                raise ValueError(f"GaussianNoise: shape_ref has more than {MAX_NOISE_ELEMENTS} elements")
            shape: tuple[int, ...] = tuple(ref.shape)
        else:
            shape = parse_shape("GaussianNoise", params.get("shape", "1,3,8,8"))
        mean = float_param(params, "mean", 0.0)
        std = max(0.0, float_param(params, "std", 1.0))
        gen = torch.Generator().manual_seed(int_param(params, "seed", 42))
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        # Scaled and shifted only when asked, so the standard normal is the raw draw.
        if std != 1.0:
            noise = noise * std
        if mean != 0.0:
            noise = noise + mean
        device = ref.device if isinstance(ref, torch.Tensor) else ctx.device
        return {"noise": noise.to(device)}


class LerpNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Lerp", DIFFUSION
    DESCRIPTION = "alpha * a + (1 - alpha) * b; alpha from its input when connected, else the param"
    INPUTS = (T("tensor_a", "Weighted by alpha"), T("tensor_b", "Weighted by 1 - alpha"),
              T("alpha", "Blend weight (scalar or broadcastable tensor)", optional=True))
    OUTPUTS = (T("tensor", "The blend"),)
    PARAMS = (F("alpha", 0.5, "Blend weight when the alpha input is not connected"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        a, b = self.float_tensor(inputs, "tensor_a"), self.float_tensor(inputs, "tensor_b")
        alpha: Any = float_param(params, "alpha", 0.5)
        if inputs.get("alpha") is not None:
            alpha = self.float_tensor(inputs, "alpha").to(a.device)
        try:
            return {"tensor": alpha * a + (1 - alpha) * b.to(a.device)}
        except RuntimeError as exc:
            raise ValueError(f"Lerp: tensors of shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                             f"broadcast ({exc})") from None


def build_timestep_mlp(embed_dim: int, max_period: int, seed: int) -> Any:
    """The sinusoidal frequency bank followed by Linear(D, 4D) -> SiLU -> Linear(4D, D),
    weights randn(seed) / sqrt(D) and zero biases (module keys fc1.*, fc2.*)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as functional

    class TimestepMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(embed_dim, 4 * embed_dim)
            self.fc2 = nn.Linear(4 * embed_dim, embed_dim)

        def forward(self, t: Any) -> Any:
            half = embed_dim // 2
            freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device)
                              / half)
            args = t.float().unsqueeze(-1) * freqs.unsqueeze(0)
            emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
            return self.fc2(functional.silu(self.fc1(emb)))

    mlp = TimestepMLP()
    gen = torch.Generator().manual_seed(int(seed))
    scale = 1.0 / math.sqrt(embed_dim)
    with torch.no_grad():
        for layer in (mlp.fc1, mlp.fc2):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * scale)
            layer.bias.zero_()
    return mlp


class TimestepEmbeddingNode(DeclaredNode):
    NODE_NAME, CATEGORY = "TimestepEmbedding", DIFFUSION
    DESCRIPTION = "Diffusion timestep -> vector: sinusoidal frequencies, then Linear-SiLU-Linear"
    INPUTS = (T("timestep", "A number, a 0-d tensor or a [B] tensor of timesteps"),)
    OUTPUTS = (T("embedding", "[B, embed_dim]"),)
    PARAMS = (I("embed_dim", 32, "Width of the vector (even: half sin, half cos)", lo=2),
              I("max_period", 10000, "Largest period of the frequency bank", lo=1),
              I("seed", 42, "Seed of the projection weights"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        if inputs.get("timestep") is None:
            raise ValueError("TimestepEmbedding: the timestep input is required")
        t = self.tensor(inputs, "timestep")
        if t.dim() == 0:
            t = t.unsqueeze(0)
        dim = int_param(params, "embed_dim", 32)
        if dim < 2 or dim % 2:
            raise ValueError(f"TimestepEmbedding: embed_dim must be even and at least 2, got {dim}")
        if dim > 8192:
            raise ValueError(f"TimestepEmbedding: embed_dim {dim} is larger than 8192")
        mlp = build_timestep_mlp(dim, max(1, int_param(params, "max_period", 10000)), int_param(params, "seed", 42))
        with torch.no_grad():
            return {"embedding": mlp.to(t.device)(t.reshape(-1))}


class UpsampleNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Upsample", DIFFUSION
    DESCRIPTION = "Parameter-free resize by scale_factor (F.interpolate)"
    INPUTS = (T("tensor", "(N, C, H, W) or (N, C, L)"),)
    OUTPUTS = (T("tensor", "Resized tensor, in the input's dtype"),)
    PARAMS = (Param("mode", "select", "nearest", "Interpolation", options=["nearest", "bilinear", "area"]),
              F("scale_factor", 2.0, "Size multiplier", lo=0.1))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn.functional as functional

        x = self.tensor(inputs)
        mode = str(params.get("mode") or "nearest")
        if mode not in ("nearest", "bilinear", "area"):
            raise ValueError(f"Upsample: unknown mode {mode!r}")
        if mode == "bilinear" and x.dim() != 4:
            raise ValueError(f"Upsample: bilinear needs a 4-D (N, C, H, W) tensor, got {tuple(x.shape)}")
        if x.dim() < 3:
            raise ValueError(f"Upsample: needs (N, C, ...) with at least one spatial dim, got {tuple(x.shape)}")
        scale = float_param(params, "scale_factor", 2.0)
        if not 0.1 <= scale <= 64:
            raise ValueError(f"Upsample: scale_factor {scale} is outside 0.1..64")
        extra = {"align_corners": False} if mode == "bilinear" else {}
        out = functional.interpolate(x.float(), scale_factor=scale, mode=mode, **extra)
        return {"tensor": out.to(x.dtype)}
