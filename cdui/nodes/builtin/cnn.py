"""Convolution, pooling, dropout and normalization nodes (CodefyUI's "CNN"
and "Normalization" families).

CodefyUI keeps one persistent module per layer node between canvas runs; a
cdui run executes each node once, so each node builds its module when it runs
(fresh random weights, as in CodefyUI's API runs) and applies it. Like
CodefyUI, the modules stay in training mode: ``Dropout`` always drops and the
norm layers use batch statistics (docs/graphs-and-nodes.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import Param
from cdui.nodes.builtin._declared import B, DeclaredNode, F, I, T, float_param, int_param
from cdui.nodes.builtin._util import as_bool, parse_int_list

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

IN, OUT = (T("tensor", "Input tensor"),), (T("tensor", "Output tensor"),)

# The fixed 3x3 kernels Conv2dKernel offers (textbook image filters).
KERNELS_3X3: dict[str, list[list[float]]] = {
    "EdgeDetection3x3": [[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]],  # Laplacian
    "Sharpen3x3": [[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]],
    "VerticalEdge3x3": [[-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0]],  # Prewitt-x
}
CUSTOM = "Custom"


def _apply(node: DeclaredNode, module: Any, x: Any, expects: str) -> Any:
    """``module(x)`` on x's device, with a shape error that says what was expected."""
    try:
        return module.to(x.device)(x)
    except RuntimeError as exc:
        raise ValueError(f"{node.NODE_NAME}: input of shape {tuple(x.shape)} does not fit "
                         f"({exc}); it expects {expects}") from None


def _conv_params(in_default: int, out_default: int, kernel: int, stride: int, padding: int) -> tuple[Param, ...]:
    return (I("in_channels", in_default, "Input channels"), I("out_channels", out_default, "Output channels"),
            I("kernel_size", kernel, "Kernel size"), I("stride", stride, "Stride"),
            I("padding", padding, "Zero padding on each side"))


class Conv2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Conv2d", "CNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "2-D convolution over (N, C, H, W)"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = _conv_params(1, 32, 3, 1, 1)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.Conv2d(int_param(params, "in_channels", 1), int_param(params, "out_channels", 32),
                          int_param(params, "kernel_size", 3), stride=int_param(params, "stride", 1),
                          padding=int_param(params, "padding", 1))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs),
                                 f"(N, {layer.in_channels}, H, W)")}


class Conv1dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Conv1d", "CNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "1-D convolution over (N, C, L)"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = _conv_params(1, 32, 3, 1, 1)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.Conv1d(int_param(params, "in_channels", 1), int_param(params, "out_channels", 32),
                          int_param(params, "kernel_size", 3), stride=int_param(params, "stride", 1),
                          padding=int_param(params, "padding", 1))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), f"(N, {layer.in_channels}, L)")}


class ConvTranspose2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "ConvTranspose2d", "CNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Learned 2-D upsampling (transposed convolution)"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (*_conv_params(64, 32, 2, 2, 0), I("output_padding", 0, "Extra size added to one side of the output"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.ConvTranspose2d(int_param(params, "in_channels", 64), int_param(params, "out_channels", 32),
                                   int_param(params, "kernel_size", 2), stride=int_param(params, "stride", 2),
                                   padding=int_param(params, "padding", 0),
                                   output_padding=int_param(params, "output_padding", 0))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs),
                                 f"(N, {layer.in_channels}, H, W)")}


class MaxPool2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "MaxPool2d", "CNN"
    DESCRIPTION = "2-D max pooling"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("kernel_size", 2, "Window size"), I("stride", 2, "Stride"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.MaxPool2d(int_param(params, "kernel_size", 2), stride=int_param(params, "stride", 2))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), "(N, C, H, W) or (C, H, W)")}


class AvgPool2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "AvgPool2d", "CNN"
    DESCRIPTION = "2-D average pooling"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("kernel_size", 2, "Window size"), I("stride", 2, "Stride"), I("padding", 0, "Zero padding"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.AvgPool2d(int_param(params, "kernel_size", 2), stride=int_param(params, "stride", 2),
                             padding=int_param(params, "padding", 0))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), "(N, C, H, W) or (C, H, W)")}


class AdaptiveAvgPool2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "AdaptiveAvgPool2d", "CNN"
    DESCRIPTION = "Average-pool to a fixed output size"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("output_height", 1, "Output height"), I("output_width", 1, "Output width"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.AdaptiveAvgPool2d((int_param(params, "output_height", 1), int_param(params, "output_width", 1)))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), "(N, C, H, W) or (C, H, W)")}


class DropoutNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Dropout", "CNN"
    CACHEABLE = False  # draws from the process's random generator
    DESCRIPTION = "Zero elements with probability p and rescale the rest (always active, as in CodefyUI)"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (F("p", 0.5, "Probability of zeroing an element", lo=0.0, hi=1.0),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        return {"tensor": nn.Dropout(float_param(params, "p", 0.5))(self.float_tensor(inputs))}


def _kernel(params: dict[str, Any], node: str = "Conv2dKernel") -> list[list[float]]:
    preset = str(params.get("preset") or "EdgeDetection3x3")
    if preset != CUSTOM:
        if preset not in KERNELS_3X3:
            raise ValueError(f"{node}: unknown preset {preset!r}; use one of "
                             f"{[*KERNELS_3X3, CUSTOM]}")
        return KERNELS_3X3[preset]
    k = max(1, min(15, int_param(params, "kernel_size", 3)))
    grid = params.get("weights")
    rows = grid if isinstance(grid, list) else []
    flat = [v for row in rows for v in (row if isinstance(row, list) else [row])]
    if len(flat) != k * k:
        raise ValueError(f"{node}: weights holds {len(flat)} numbers but kernel_size={k} needs "
                         f"{k * k} ({k}x{k}); change kernel_size or fill the grid again")
    try:
        values = [float(v) for v in flat]
    except (TypeError, ValueError):
        raise ValueError(f"{node}: weights must be numbers, got {grid!r}") from None
    return [values[i * k:(i + 1) * k] for i in range(k)]


def _kernel_params() -> tuple[Param, ...]:
    return (Param("preset", "select", "EdgeDetection3x3", "A built-in 3x3 filter, or Custom",
                  options=[*KERNELS_3X3, CUSTOM]),
            Param("kernel_size", "int", 3, "Side of the Custom kernel", min_value=1, max_value=15,
                  visible_when={"preset": CUSTOM}),
            Param("weights", "tensor_grid", [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]],
                  "The Custom kernel's values", visible_when={"preset": CUSTOM}))


class Conv2dKernelNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Conv2dKernel", "CNN"
    DESCRIPTION = "A fixed convolution kernel (a preset image filter or your own NxN grid)"
    OUTPUTS = (T("tensor", "Kernel (k, k)"),)
    PARAMS = _kernel_params()

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        return {"tensor": torch.tensor(_kernel(params), dtype=torch.float32)}


class Conv2dExplicitNode(DeclaredNode):
    """Both of CodefyUI's forms: graphs made before its Conv2dKernel node was folded in wire a kernel into the
    ``kernel`` input; newer ones (its edu packs' examples) pick the kernel with this node's own ``preset``,
    ``kernel_size`` and ``weights``, as Conv2dKernel does. A connected kernel wins."""

    NODE_NAME, CATEGORY = "Conv2dExplicit", "CNN"
    DESCRIPTION = "Convolve each channel with a fixed kernel: a connected one, else the preset or grid chosen here"
    INPUTS = (T("tensor", "Input (N, C, H, W)"),
              T("kernel", "Kernel (k, k) or (1, 1, k, k) for every channel, or (C, 1, k, k) / (C, k, k) per "
                "channel; when not connected, the preset or Custom grid below", optional=True))
    OUTPUTS = (T("tensor", "Filtered (N, C, H', W')"),)
    PARAMS = (*_kernel_params(), I("stride", 1, "Stride", lo=1), I("padding", 1, "Zero padding", lo=0))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn.functional as functional

        x = self.exact_tensor(inputs)
        x = x if x.is_floating_point() else x.float()
        if x.dim() != 4:
            raise ValueError(f"Conv2dExplicit: tensor must be 4D (N, C, H, W), got shape {tuple(x.shape)}; "
                             f"add an Unsqueeze(dim=0) for a single (C, H, W) image")
        if inputs.get("kernel") is None:
            import torch

            kernel = torch.tensor(_kernel(params, "Conv2dExplicit"), dtype=torch.float32)
        else:
            kernel = self.exact_tensor(inputs, "kernel")
        weight = depthwise_weight(kernel, x.shape[1]).to(x.device, x.dtype)
        out = functional.conv2d(x, weight, bias=None, stride=max(1, int_param(params, "stride", 1)),
                                padding=max(0, int_param(params, "padding", 1)), groups=x.shape[1])
        return {"tensor": out}


def depthwise_weight(kernel: Any, c: int) -> Any:
    """The (C, 1, k, k) weight of a depthwise convolution over ``c`` channels from the kernel
    forms CodefyUI takes: (k, k) and (1, 1, k, k) for every channel, (C, 1, k, k) one per
    channel; and (C, k, k), which cdui also takes."""
    shape = tuple(kernel.shape)
    if kernel.dim() == 2:
        k = kernel.reshape(1, 1, *shape)
    elif kernel.dim() == 3:
        if shape[0] != c:
            raise ValueError(f"Conv2dExplicit: a 3D kernel must be (C={c}, k, k), got shape {shape}; "
                             f"or use (k, k) for every channel")
        k = kernel.unsqueeze(1)
    elif kernel.dim() == 4:
        if shape[1] != 1:
            raise ValueError(f"Conv2dExplicit: a 4D kernel's inner channel must be 1 (depthwise), got shape "
                             f"{shape}; use (1, 1, k, k) or ({c}, 1, k, k)")
        if shape[0] not in (1, c):
            raise ValueError(f"Conv2dExplicit: a 4D kernel's out-channel must be 1 or C={c}, got shape {shape}")
        k = kernel
    else:
        raise ValueError(f"Conv2dExplicit: kernel must be 2D (k, k) or 4D (1, 1, k, k) / ({c}, 1, k, k), "
                         f"got shape {shape}")
    if k.shape[2] != k.shape[3]:
        raise ValueError(f"Conv2dExplicit: kernel must be square (k, k), got shape {shape}")
    return k.expand(c, 1, k.shape[2], k.shape[3]).contiguous()


class BatchNorm2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "BatchNorm2d", "CNN"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Batch normalization over (N, C, H, W), with batch statistics"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("num_features", 32, "Channels C"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.BatchNorm2d(int_param(params, "num_features", 32))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), f"(N, {layer.num_features}, H, W)")}


class BatchNorm1dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "BatchNorm1d", "Normalization"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Batch normalization over (N, C) or (N, C, L), with batch statistics"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("num_features", 128, "Features C"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.BatchNorm1d(int_param(params, "num_features", 128))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), f"(N, {layer.num_features}[, L])")}


class GroupNormNode(DeclaredNode):
    NODE_NAME, CATEGORY = "GroupNorm", "Normalization"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Group normalization"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("num_groups", 32, "Groups the channels are split into"), I("num_channels", 256, "Channels C"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        groups, channels = int_param(params, "num_groups", 32), int_param(params, "num_channels", 256)
        if groups < 1 or channels % groups:
            raise ValueError(f"GroupNorm: num_channels={channels} must be divisible by num_groups={groups}")
        layer = nn.GroupNorm(groups, channels)
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), f"(N, {channels}, ...)")}


class InstanceNorm2dNode(DeclaredNode):
    NODE_NAME, CATEGORY = "InstanceNorm2d", "Normalization"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Instance normalization over (N, C, H, W)"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (I("num_features", 64, "Channels C"), B("affine", False, "Learnable scale and shift"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        layer = nn.InstanceNorm2d(int_param(params, "num_features", 64), affine=as_bool(params.get("affine")))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), f"(N, {layer.num_features}, H, W)")}


class LayerNormNode(DeclaredNode):
    NODE_NAME, CATEGORY = "LayerNorm", "Normalization"
    CACHEABLE = False  # owns weights: new ones each run, trained in place
    DESCRIPTION = "Layer normalization over the last dimension(s)"
    INPUTS, OUTPUTS = IN, OUT
    PARAMS = (Param("normalized_shape", "string", "512", "Shape of the normalized trailing dims, comma-separated"),
              F("eps", 1e-05, "Added to the variance for stability"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn as nn

        shape = parse_int_list(params.get("normalized_shape", "512"), "normalized_shape")
        if not shape:
            raise ValueError("LayerNorm: normalized_shape is empty; give the trailing dims, e.g. 512")
        layer = nn.LayerNorm(shape, eps=float_param(params, "eps", 1e-05))
        return {"tensor": _apply(self, layer, self.float_tensor(inputs), f"(..., {', '.join(map(str, shape))})")}
