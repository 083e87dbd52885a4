"""A node declared by tables: ports and params as class attributes.

Most tensor and layer nodes are one line of torch behind CodefyUI's interface;
declaring their interface as data keeps each of them a few lines long and
makes the interface easy to compare with CodefyUI's catalog (the interface
test reads ``define_inputs`` / ``define_outputs`` / ``define_params`` like any
other node). Nothing here imports torch at module level.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import Node, Param, Port
from cdui.nodes.builtin._util import as_tensor

if TYPE_CHECKING:  # pragma: no cover
    pass


class DeclaredNode(Node):
    """Base of the table-declared nodes; not registered itself (no NODE_NAME). It stays
    abstract: each node implements :meth:`Node.execute`."""

    INPUTS: ClassVar[tuple[Port, ...]] = ()
    OUTPUTS: ClassVar[tuple[Port, ...]] = ()
    PARAMS: ClassVar[tuple[Param, ...]] = ()

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return list(cls.INPUTS)

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return list(cls.OUTPUTS)

    @classmethod
    def define_params(cls) -> list[Param]:
        return list(cls.PARAMS)

    def tensor(self, inputs: dict[str, Any], name: str = "tensor") -> Any:
        """Input ``name`` as a tensor (lists and numbers are converted), with an
        error naming this node when it is missing."""
        try:
            return as_tensor(inputs.get(name), name)
        except ValueError as exc:
            raise ValueError(f"{self.NODE_NAME}: {exc}") from None

    def exact_tensor(self, inputs: dict[str, Any], name: str = "tensor") -> Any:
        """Input ``name``, which must already be a tensor: for the nodes whose CodefyUI
        original takes no list in its place (a list there is a wiring mistake)."""
        import torch

        value = inputs.get(name)
        if not isinstance(value, torch.Tensor):
            got = "nothing" if value is None else type(value).__name__
            raise ValueError(f"{self.NODE_NAME}: `{name}` input must be a torch.Tensor, got {got}; connect "
                             f"a tensor output (a TensorInput or TensorCreate node makes one from numbers)")
        return value

    def float_tensor(self, inputs: dict[str, Any], name: str = "tensor") -> Any:
        x = self.tensor(inputs, name)
        return x if x.is_floating_point() else x.float()


def int_param(params: dict[str, Any], name: str, default: int) -> int:
    value = params.get(name, default)
    return default if value is None or value == "" else int(value)


def float_param(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name, default)
    return default if value is None or value == "" else float(value)


def T(name: str, description: str = "", optional: bool = False) -> Port:
    """A TENSOR port."""
    return Port(name, "TENSOR", description, optional)


def I(name: str, default: int, description: str = "", lo: float | None = None,  # noqa: E743 - a table column
      hi: float | None = None) -> Param:
    """An int param."""
    return Param(name, "int", default, description, min_value=lo, max_value=hi)


def F(name: str, default: float, description: str = "", lo: float | None = None,
      hi: float | None = None) -> Param:
    """A float param."""
    return Param(name, "float", default, description, min_value=lo, max_value=hi)


def B(name: str, default: bool, description: str = "") -> Param:
    """A bool param."""
    return Param(name, "bool", default, description)
