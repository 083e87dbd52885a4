"""CodefyUI's toy diffusion U-Net and its reverse-DDPM sampler.

The U-Net keeps CodefyUI's module layout (``time_mlp.fc1/fc2``, ``stem``,
``down_blocks.<i>.{norm1,conv1,time_proj,norm2,conv2[,skip]}``,
``bottleneck``, ``up_blocks.<i>``, ``head``) and its seeded initialisation
(each residual block from its own seed, offset by its place in the net), so a
state_dict saved by either side loads in the other and equal params give
equal weights.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cdui.nodes.base import MODEL, Param, Port
from cdui.nodes.builtin._declared import DeclaredNode, F, I, T, float_param, int_param
from cdui.nodes.builtin.diffusion import build_timestep_mlp

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

DIFFUSION = "Diffusion"
# Size bounds checked before any weight is allocated.
MAX_LEVELS = 6
MAX_CHANNELS = 4096
MAX_SAMPLER_STEPS = 10_000


def parse_mult(text: Any) -> tuple[int, ...]:
    parts = [p.strip() for p in str(text if text is not None else "").split(",") if p.strip()]
    if not parts:
        raise ValueError("DiffusionUNet: channel_mult is empty; give comma-separated multipliers such as 1,2,4")
    try:
        mults = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"DiffusionUNet: channel_mult {text!r} is not a list of integers") from None
    if any(m <= 0 for m in mults):
        raise ValueError("DiffusionUNet: every channel multiplier must be positive")
    if len(mults) > MAX_LEVELS:
        raise ValueError(f"DiffusionUNet: channel_mult has more than {MAX_LEVELS} levels")
    return mults


def _res_block(cin: int, cout: int, groups: int, temb: int, seed: int) -> Any:
    """GroupNorm-SiLU-Conv3x3, plus the projected time embedding, then
    GroupNorm-SiLU-Conv3x3, added to the input (through a 1x1 conv when the
    channel count changes). Weights randn(seed) / sqrt(cin), biases zero."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as functional

    class ResBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.GroupNorm(groups, cin)
            self.conv1 = nn.Conv2d(cin, cout, kernel_size=3, padding=1)
            self.time_proj = nn.Linear(temb, cout)
            self.norm2 = nn.GroupNorm(groups, cout)
            self.conv2 = nn.Conv2d(cout, cout, kernel_size=3, padding=1)
            self.skip: nn.Module = nn.Conv2d(cin, cout, kernel_size=1) if cin != cout else nn.Identity()

        def forward(self, x: Any, t_emb: Any) -> Any:
            h = self.conv1(functional.silu(self.norm1(x)))
            h = h + self.time_proj(t_emb)[:, :, None, None]
            h = self.conv2(functional.silu(self.norm2(h)))
            return h + self.skip(x)

    block = ResBlock()
    gen = torch.Generator().manual_seed(int(seed))
    scale = 1.0 / math.sqrt(max(cin, 1))
    layers: list[Any] = [block.conv1, block.conv2, block.time_proj]
    if isinstance(block.skip, nn.Conv2d):
        layers.append(block.skip)
    with torch.no_grad():
        for layer in layers:
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * scale)
            layer.bias.zero_()
    return block


def build_unet(in_channels: int, base: int, mult: tuple[int, ...], temb: int, groups: int, seed: int) -> Any:
    import torch
    import torch.nn as nn
    import torch.nn.functional as functional

    if any((base * m) % groups for m in mult):
        raise ValueError(f"DiffusionUNet: num_groups={groups} must divide every base_channels*mult "
                         f"(base_channels={base}, channel_mult={','.join(map(str, mult))})")
    if temb % 2:
        raise ValueError(f"DiffusionUNet: time_emb_dim must be even, got {temb}")
    if max(in_channels, base * max(mult), temb) > MAX_CHANNELS:
        raise ValueError(f"DiffusionUNet: channel counts above {MAX_CHANNELS} are refused")

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.time_mlp = build_timestep_mlp(temb, 10000, seed)
            self.stem = nn.Conv2d(in_channels, base, kernel_size=3, padding=1)
            self.down_blocks = nn.ModuleList()
            skips: list[int] = []
            ch = base
            for level, m in enumerate(mult[:-1]):
                self.down_blocks.append(_res_block(ch, base * m, groups, temb, seed + 100 + level))
                ch = base * m
                skips.append(ch)
            self.bottleneck = _res_block(ch, base * mult[-1], groups, temb, seed + 200)
            ch = base * mult[-1]
            self.up_blocks = nn.ModuleList()
            for level, skip_ch in enumerate(reversed(skips)):
                self.up_blocks.append(_res_block(ch + skip_ch, skip_ch, groups, temb, seed + 300 + level))
                ch = skip_ch
            self.head = nn.Conv2d(ch, in_channels, kernel_size=1)

        def forward(self, x: Any, t: Any) -> Any:
            if t.dim() == 0:
                t = t.unsqueeze(0)
            if t.shape[0] == 1 and x.shape[0] > 1:
                t = t.expand(x.shape[0])
            t_emb = self.time_mlp(t)
            h = self.stem(x)
            kept = []
            for block in self.down_blocks:
                h = block(h, t_emb)
                kept.append(h)
                h = functional.max_pool2d(h, 2)
            h = self.bottleneck(h, t_emb)
            for block, skip in zip(self.up_blocks, reversed(kept), strict=True):
                h = functional.interpolate(h, scale_factor=2, mode="nearest")
                if h.shape[-2:] != skip.shape[-2:]:
                    raise ValueError(f"DiffusionUNet: input height and width must be divisible by "
                                     f"{2 ** (len(mult) - 1)} (got {tuple(x.shape[-2:])})")
                h = block(torch.cat([h, skip], dim=1), t_emb)
            return self.head(h)

    net = UNet()
    gen = torch.Generator().manual_seed(seed + 999)
    with torch.no_grad():
        for layer in (net.stem, net.head):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.1)
            assert layer.bias is not None
            layer.bias.zero_()
    return net


class DiffusionUNetNode(DeclaredNode):
    NODE_NAME, CATEGORY = "DiffusionUNet", DIFFUSION
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "A seeded, time-conditioned toy U-Net: model(x, t) predicts noise shaped like x"
    OUTPUTS = (Port("model", MODEL, "nn.Module taking (x, t)"),)
    PARAMS = (I("in_channels", 3, "Channels of the input", lo=1),
              I("base_channels", 16, "Channels after the stem", lo=1),
              Param("channel_mult", "string", "1,2,4", "Channel multiplier per level (the last is the bottleneck)"),
              I("time_emb_dim", 32, "Width of the timestep embedding (even)", lo=2),
              I("num_groups", 4, "GroupNorm groups; must divide every level's channels", lo=1),
              I("seed", 42, "Seed of every weight"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        net = build_unet(int_param(params, "in_channels", 3), int_param(params, "base_channels", 16),
                         parse_mult(params.get("channel_mult", "1,2,4")), int_param(params, "time_emb_dim", 32),
                         max(1, int_param(params, "num_groups", 4)), int_param(params, "seed", 42))
        return {"model": net.to(ctx.device)}


def ddpm_betas(schedule: str, steps: int, beta_start: float, beta_end: float) -> Any:
    """Linear betas, or Nichol and Dhariwal's cosine schedule clamped to [1e-4, 0.999]."""
    import torch

    if schedule == "linear":
        return torch.linspace(beta_start, beta_end, steps, dtype=torch.float32)
    if schedule == "cosine":
        s = 0.008
        t = torch.linspace(0, steps, steps + 1, dtype=torch.float32) / steps
        alpha_bar = torch.cos(((t + s) / (1 + s)) * math.pi / 2) ** 2
        alpha_bar = alpha_bar / alpha_bar[0]
        return torch.clamp(1 - alpha_bar[1:] / alpha_bar[:-1], 0.0001, 0.999)
    raise ValueError(f"DDPMSampler: unknown schedule {schedule!r}")


class DDPMSamplerNode(DeclaredNode):
    NODE_NAME, CATEGORY = "DDPMSampler", DIFFUSION
    CACHEABLE = False  # draws from the process's random generator
    DESCRIPTION = "The reverse DDPM loop: from noise x_T to x_0, one model call per step"
    INPUTS = (Port("model", MODEL, "Noise-predicting model(x, t)"), T("noise", "Starting x_T, [N, C, H, W]"),
              T("condition", "Reserved; unused", optional=True))
    OUTPUTS = (T("image", "x_0, shaped like the noise"),)
    PARAMS = (I("num_steps", 20, "Reverse steps", lo=1),
              Param("schedule", "select", "linear", "Beta schedule", options=["linear", "cosine"]),
              F("beta_start", 0.0001, "First beta (linear)", lo=0.0), F("beta_end", 0.02, "Last beta (linear)", lo=0.0),
              I("seed", 42, "Seed of the noise added at each step"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        model = inputs.get("model")
        if model is None or not callable(model):
            raise ValueError("DDPMSampler: the model input must be a callable model(x, t)")
        x = self.float_tensor(inputs, "noise").clone()
        steps = int_param(params, "num_steps", 20)
        if not 1 <= steps <= MAX_SAMPLER_STEPS:
            raise ValueError(f"DDPMSampler: num_steps must be within 1..{MAX_SAMPLER_STEPS}")
        betas = ddpm_betas(str(params.get("schedule") or "linear"), steps, float_param(params, "beta_start", 0.0001),
                           float_param(params, "beta_end", 0.02)).to(x.device)
        alphas = 1.0 - betas
        alpha_bars = torch.cumprod(alphas, dim=0)
        gen = torch.Generator().manual_seed(int_param(params, "seed", 42))
        if hasattr(model, "eval"):
            model.eval()
        with torch.no_grad():
            for done, t in enumerate(reversed(range(steps))):
                ctx.check_stop()
                eps = model(x, torch.full((x.shape[0],), t, dtype=torch.long, device=x.device))
                mean = (1.0 / torch.sqrt(alphas[t])) * (x - (betas[t] / torch.sqrt(1.0 - alpha_bars[t])) * eps)
                if t > 0:
                    z = torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device)
                    x = mean + torch.sqrt(betas[t]) * z
                else:
                    x = mean
                ctx.progress(event="batch", batch=done + 1, total_batches=steps, timestep=t)
        return {"image": x}
