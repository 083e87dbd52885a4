"""Tensor operation nodes (CodefyUI's "Tensor Operations" family, plus the
Utility nodes Concat and Reshape): one torch call each, under CodefyUI's
names, ports, params and defaults, so its graphs run unchanged.

Two behaviours differ from plain torch on purpose, because CodefyUI's graphs
depend on them (docs/graphs-and-nodes.md lists them): ``Squeeze`` with
``dim=-1`` (the default) removes *every* size-1 dimension, and ``Split``
offers its pieces on dynamic ports ``chunk_0`` … ``chunk_{chunks-1}``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdui.nodes.base import Param
from cdui.nodes.builtin._declared import B, DeclaredNode, F, I, T, float_param, int_param
from cdui.nodes.builtin._util import as_bool, parse_int_list

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

OPS = "Tensor Operations"
# Split's largest number of pieces (CodefyUI clamps `chunks` to this).
MAX_CHUNKS = 32


def _pair(node: DeclaredNode, inputs: dict[str, Any]) -> tuple[Any, Any]:
    return node.tensor(inputs, "tensor_a"), node.tensor(inputs, "tensor_b")


class AddNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Add", OPS
    DESCRIPTION = "Element-wise a + alpha * b, with broadcasting"
    INPUTS = (T("tensor_a", "First tensor"), T("tensor_b", "Second tensor"))
    OUTPUTS = (T("tensor", "Sum"),)
    PARAMS = (F("alpha", 1.0, "Multiplier of tensor_b"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        a, b = _pair(self, inputs)
        alpha: float | int = float_param(params, "alpha", 1.0)
        if not (a.is_floating_point() or a.is_complex() or b.is_floating_point() or b.is_complex()):
            # Validation makes alpha a float (1 -> 1.0), and torch refuses a float alpha for integer
            # tensors; a whole number is the integer CodefyUI's graphs mean, and keeps the int dtype.
            if not float(alpha).is_integer():
                raise ValueError(f"Add: alpha={alpha} is not a whole number, which integer tensors "
                                 f"({a.dtype}, {b.dtype}) cannot take; use a whole alpha or float tensors")
            alpha = int(alpha)
        return {"tensor": torch.add(a, b, alpha=alpha)}


class MultiplyNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Multiply", OPS
    DESCRIPTION = "Element-wise product a * b, with broadcasting"
    INPUTS = (T("tensor_a", "First tensor"), T("tensor_b", "Second tensor"))
    OUTPUTS = (T("tensor", "Product"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        a, b = _pair(self, inputs)
        return {"tensor": a * b}


class MatMulNode(DeclaredNode):
    NODE_NAME, CATEGORY = "MatMul", OPS
    DESCRIPTION = "Matrix product torch.matmul(a, b)"
    INPUTS = (T("tensor_a", "Left matrix"), T("tensor_b", "Right matrix"))
    OUTPUTS = (T("tensor", "Product"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        a, b = _pair(self, inputs)
        try:
            return {"tensor": torch.matmul(a, b)}
        except RuntimeError as exc:
            # Still torch's RuntimeError, as in CodefyUI, with the shapes and what to change.
            raise RuntimeError(f"MatMul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                               f"multiplied ({exc}); the last dim of a must equal the first matrix "
                               f"dim of b") from None


class ScalarMultiplyNode(DeclaredNode):
    NODE_NAME, CATEGORY = "ScalarMultiply", OPS
    DESCRIPTION = "Multiply a tensor by a constant"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Scaled tensor"),)
    PARAMS = (F("scalar", 1.0, "The constant"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        return {"tensor": self.tensor(inputs) * float_param(params, "scalar", 1.0)}


class ArgmaxNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Argmax", OPS
    DESCRIPTION = "Index of the largest value along a dimension"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Indices"),)
    PARAMS = (I("dim", -1, "Dimension to reduce"), B("keepdim", False, "Keep the reduced dimension"))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        return {"tensor": torch.argmax(self.tensor(inputs), dim=int_param(params, "dim", -1),
                                       keepdim=as_bool(params.get("keepdim"), False))}


class SoftmaxNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Softmax", OPS
    DESCRIPTION = "Softmax along a dimension"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Probabilities"),)
    PARAMS = (I("dim", -1, "Dimension the probabilities sum over"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch.nn.functional as functional

        return {"tensor": functional.softmax(self.float_tensor(inputs), dim=int_param(params, "dim", -1))}


class PermuteNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Permute", OPS
    DESCRIPTION = "Reorder dimensions"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Permuted tensor"),)
    PARAMS = (Param("dims", "string", "0,2,1", "New order of the dimensions, comma-separated"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        x = self.tensor(inputs)
        dims = parse_int_list(params.get("dims", "0,2,1"), "dims")
        if sorted(d % x.dim() if x.dim() else d for d in dims) != list(range(x.dim())):
            raise ValueError(f"Permute: dims={params.get('dims')!r} is not an order of the input's "
                             f"{x.dim()} dimensions (shape {tuple(x.shape)}); give each of "
                             f"0..{x.dim() - 1} once")
        return {"tensor": x.permute(*dims)}


class SqueezeNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Squeeze", OPS
    DESCRIPTION = "Remove size-1 dimensions (dim=-1: all of them)"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Squeezed tensor"),)
    PARAMS = (I("dim", -1, "Dimension to remove; -1 removes every size-1 dimension"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        x = self.tensor(inputs)
        dim = int_param(params, "dim", -1)
        # CodefyUI's -1 means "every size-1 dim", not "the last dim" as in torch.
        return {"tensor": x.squeeze() if dim == -1 else x.squeeze(dim)}


class UnsqueezeNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Unsqueeze", OPS
    DESCRIPTION = "Insert a size-1 dimension"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Tensor with one more dimension"),)
    PARAMS = (I("dim", 0, "Where the new dimension goes"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        return {"tensor": self.tensor(inputs).unsqueeze(int_param(params, "dim", 0))}


class StackNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Stack", OPS
    DESCRIPTION = "Stack two tensors of one shape along a new dimension"
    INPUTS = (T("tensor_a", "First tensor"), T("tensor_b", "Second tensor"))
    OUTPUTS = (T("tensor", "Stacked tensor"),)
    PARAMS = (I("dim", 0, "Position of the new dimension"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        a, b = _pair(self, inputs)
        if a.shape != b.shape:
            raise ValueError(f"Stack: the tensors must have one shape, got {tuple(a.shape)} and "
                             f"{tuple(b.shape)}; use Concat to join along an existing dimension")
        return {"tensor": torch.stack([a, b], dim=int_param(params, "dim", 0))}


class ConcatNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Concat", "Utility"
    DESCRIPTION = "Join two tensors along an existing dimension"
    INPUTS = (T("tensor_a", "First tensor"), T("tensor_b", "Second tensor"))
    OUTPUTS = (T("tensor", "Joined tensor"),)
    PARAMS = (I("dim", 0, "Dimension to join along"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        a, b = _pair(self, inputs)
        dim = int_param(params, "dim", 0)
        try:
            return {"tensor": torch.cat([a, b], dim=dim)}
        except RuntimeError as exc:
            # Still torch's RuntimeError, as in CodefyUI, with the shapes and what to change.
            raise RuntimeError(f"Concat: cannot join {tuple(a.shape)} and {tuple(b.shape)} along "
                               f"dim {dim} ({exc}); every other dimension must match") from None


class ReshapeNode(DeclaredNode):
    NODE_NAME, CATEGORY = "Reshape", "Utility"
    DESCRIPTION = "Reshape to a full shape (batch dimension included; one -1 is inferred)"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("tensor", "Reshaped tensor"),)
    PARAMS = (Param("shape", "string", "-1,784", "Target shape, comma-separated (e.g. -1,784)"),)

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        x = self.tensor(inputs)
        shape = parse_int_list(params.get("shape", "-1,784"), "shape")
        try:
            return {"tensor": x.reshape(*shape)}
        except RuntimeError:
            raise ValueError(f"Reshape: a tensor of shape {tuple(x.shape)} ({x.numel()} elements) "
                             f"cannot take the shape {params.get('shape')!r}; the sizes must "
                             f"multiply to {x.numel()}") from None


class SplitNode(DeclaredNode):
    """Pieces on ``chunk_0`` … ``chunk_{n-1}``; the catalog lists the first
    two, and :meth:`dynamic_output` admits the rest to validation."""

    NODE_NAME, CATEGORY = "Split", OPS
    DESCRIPTION = "Cut a tensor into equal pieces along a dimension"
    INPUTS = (T("tensor", "Input tensor"),)
    OUTPUTS = (T("chunk_0", "First piece"), T("chunk_1", "Second piece"))
    PARAMS = (I("chunks", 2, "Number of pieces", lo=1, hi=MAX_CHUNKS), I("dim", 0, "Dimension to cut"))

    @classmethod
    def pieces(cls, params: dict[str, Any]) -> int:
        """How many pieces these params ask for (CodefyUI clamps to 1..MAX_CHUNKS)."""
        try:
            return max(1, min(MAX_CHUNKS, int(params.get("chunks", 2))))
        except (TypeError, ValueError):
            return 2

    @classmethod
    def dynamic_output(cls, name: str, params: dict[str, Any]) -> bool:
        """Whether ``name`` is one of this node's pieces for these params."""
        if not name.startswith("chunk_") or not name[6:].isdigit():
            return False
        return int(name[6:]) < cls.pieces(params)

    @classmethod
    def output_names(cls, params: dict[str, Any]) -> list[str]:
        return [f"chunk_{i}" for i in range(cls.pieces(params))]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        import torch

        chunks = max(1, min(MAX_CHUNKS, int_param(params, "chunks", 2)))
        pieces = torch.chunk(self.tensor(inputs), chunks, dim=int_param(params, "dim", 0))
        return {f"chunk_{i}": piece for i, piece in enumerate(pieces)}
