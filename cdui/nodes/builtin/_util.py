"""Small helpers shared by the built-in nodes.

Nothing here imports torch at module level: the registry imports every
built-in module when the server starts, and the server itself never runs a
node. Functions that need torch import it when called.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

DEVICE_OPTIONS = ["auto", "cpu", "cuda", "mps"]


# -- parsing param strings -----------------------------------------------------
def parse_int_list(text: Any, name: str) -> list[int]:
    """``"0, 2,3"`` -> ``[0, 2, 3]``; empty -> ``[]``."""
    raw = str(text if text is not None else "").strip()
    if not raw:
        return []
    try:
        return [int(part.strip()) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers (e.g. '0,2,3'), "
                         f"got {text!r}") from None


# Most elements a shape param may ask for (8 GiB of float32): a run asking for more could only fail
# allocating them, or be killed for memory, after it was queued and started.
MAX_SHAPE_ELEMENTS = 2 ** 31


def shape_problem(name: str, text: Any, max_elements: int = MAX_SHAPE_ELEMENTS, max_dims: int = 32,
                  allow_empty: bool = False) -> list[tuple[str, str]]:
    """``[(param, why)]`` when the comma-separated shape ``text`` of param ``name`` can never make a tensor
    (not integers, a dim below 1, too many dims or elements); ``[]`` when it can. Pure: for
    :meth:`Node.check_params`, so a bad shape is refused at submit, with the param named."""
    raw = str(text if text is not None else "").strip()
    if not raw:
        return [] if allow_empty else [(name, f"{name}={text!r} is empty; give comma-separated dims, e.g. 1,3,8,8")]
    try:
        dims = [int(part.strip()) for part in raw.split(",")]
    except ValueError:
        return [(name, f"{name}={text!r} is not comma-separated integers, e.g. 1,3,8,8")]
    if any(d < 1 for d in dims):
        return [(name, f"{name}={text!r} has a dim below 1; every dim must be at least 1")]
    if len(dims) > max_dims:
        return [(name, f"{name}={text!r} has {len(dims)} dims, more than {max_dims}")]
    if math.prod(dims) > max_elements:
        return [(name, f"{name}={text!r} asks for {math.prod(dims):,} elements, more than {max_elements:,}")]
    return []


def parse_shape(text: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(s.strip()) for s in str(text).split(","))
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise ValueError(f"shape must be comma-separated positive integers "
                         f"(e.g. 1,3,224,224), got {text!r}")
    return shape


def parse_float_sequence(value: Any, name: str, length: int | None = None) -> tuple[float, ...] | None:
    """``"0.9, 0.999"`` -> ``(0.9, 0.999)``; empty or None -> None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        items: list[Any] = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        text = str(value).strip().strip("[]()")
        if not text:
            return None
        items = [p for p in text.split(",") if p.strip()]
    try:
        out = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be comma-separated numbers, got {value!r}") from None
    if length is not None and len(out) != length:
        raise ValueError(f"{name} needs exactly {length} numbers, got {len(out)} in {value!r}")
    return out


def as_bool(value: Any, default: bool = False) -> bool:
    """Params arrive coerced, but graphs written by hand carry ``"false"``."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


# -- tensors --------------------------------------------------------------------
def as_tensor(value: Any, name: str, dtype: Any = None) -> Any:
    import torch

    if value is None:
        raise ValueError(f"input {name!r} is not connected or carried no value")
    if isinstance(value, torch.Tensor):
        return value if dtype is None else value.to(dtype)
    try:
        return torch.as_tensor(value, dtype=dtype if dtype is not None else torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"input {name!r} must be a tensor or nested list of numbers, "
                         f"got {type(value).__name__}: {exc}") from None


def as_list(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return value.tolist()
    return list(value)


# -- devices --------------------------------------------------------------------
def device_available(device: str) -> bool:
    import torch

    kind, _, index = device.partition(":")
    if kind == "cpu":
        return True
    if kind == "cuda":
        # A run's process sees only its own card (cuda:0): a graph written for
        # cuda:1 on a bigger machine must fall back, not fail inside torch.
        if not torch.cuda.is_available():
            return False
        return not index or (index.isdigit() and int(index) < torch.cuda.device_count())
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        return bool(mps and mps.is_available())
    return False


def resolve_device(requested: Any, ctx: RunContext | None) -> str:
    """The device a node should use: ``auto`` follows the run's device; an
    unavailable device falls back (run's device, then cpu) with a warning
    rather than failing a run that was written on a machine with a GPU."""
    want = str(requested or "auto").strip().lower()
    run_device = str(getattr(ctx, "device", None) or "cpu")
    if want == "auto":
        want = run_device
    if device_available(want):
        return want
    fallback = run_device if run_device != want and device_available(run_device) else "cpu"
    if ctx is not None:
        ctx.warning("device_fallback",
                    f"device {want!r} is not available on this machine; using {fallback!r}",
                    requested=want, used=fallback)
    return fallback


def to_device(obj: Any, device: str) -> Any:
    """Move a tensor or module (or a list/tuple/dict of them) to ``device``."""
    if hasattr(obj, "to") and callable(obj.to):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


# -- display --------------------------------------------------------------------
def summarize(value: Any, max_items: int = 64) -> Any:
    """A JSON-safe picture of a node value (for logs and webhook payloads)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        torch = None  # type: ignore[assignment]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if torch is not None and isinstance(value, torch.Tensor):
        out: dict[str, Any] = {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
        if value.numel() <= max_items:
            out["values"] = value.detach().cpu().tolist()
        return out
    if isinstance(value, dict):
        return {str(k): summarize(v, max_items) for k, v in list(value.items())[:max_items]}
    if isinstance(value, (list, tuple)):
        items = [summarize(v, max_items) for v in list(value)[:max_items]]
        if len(value) > max_items:
            items.append(f"... {len(value) - max_items} more")
        return items
    return f"<{type(value).__name__}>"
