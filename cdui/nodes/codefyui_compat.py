"""CodefyUI's node API, so that plugin packs written for CodefyUI load in cdui with no edit.

A CodefyUI pack's node files import ``app.core.node_base`` (``BaseNode``, ``PortDefinition``,
``ParamDefinition``, ``DataType``, ``ParamType``, the media kinds, ``is_param_visible``,
``resolve_count_param``), ``app.core.step_trace`` (``StepRecorder``, ``Step``) and
``app.core.stateful_module`` (``StatefulModuleMixin``). :func:`install_modules` puts modules of
those names into ``sys.modules`` (only names nothing else provides), made of the classes here;
:func:`adapt` turns each of a pack's node classes into a :class:`cdui.nodes.base.Node` that
runs it: ports and params translated, ``execute(inputs, params, progress_callback, context=...)``
called with a context that has what CodefyUI's nodes read (``verbose``, ``device``, the current
node id, ``log_warning``), and the module a stateful node builds kept for the run.

Written from CodefyUI's public documentation and the APIs its official packs use; no code of
CodefyUI's is copied here.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import random
import re
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from cdui.nodes.base import Node, Param, Port, Step, StepRecorder

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

log = logging.getLogger("cdui.plugins")
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class DataType(str, Enum):  # noqa: UP042 - as CodefyUI declares it, so str() and format() give what packs expect
    TENSOR = "TENSOR"
    MODEL = "MODEL"
    DATASET = "DATASET"
    DATALOADER = "DATALOADER"
    OPTIMIZER = "OPTIMIZER"
    LOSS_FN = "LOSS_FN"
    SCALAR = "SCALAR"
    STRING = "STRING"
    IMAGE = "IMAGE"
    LIST = "LIST"
    ANY = "ANY"
    TRIGGER = "TRIGGER"
    TRANSFORM = "TRANSFORM"


class ParamType(str, Enum):  # noqa: UP042 - as CodefyUI declares it
    INT = "int"
    FLOAT = "float"
    STRING = "string"
    BOOL = "bool"
    SELECT = "select"
    MODEL_FILE = "model_file"
    IMAGE_FILE = "image_file"
    DATA_FILE = "data_file"
    TENSOR_GRID = "tensor_grid"
    SECRET = "secret"
    CODE = "code"


# The kinds of renderable media a port may declare (CodefyUI shows them; cdui records the value as it is).
MEDIA_IMAGE = "image"
MEDIA_CHART = "chart"
MEDIA_VIDEO = "video"


@dataclass
class PortDefinition:
    name: str
    data_type: DataType
    description: str = ""
    optional: bool = False
    media: str | None = None


@dataclass
class ParamDefinition:
    name: str
    param_type: ParamType
    default: Any = None
    description: str = ""
    options: list[str] = field(default_factory=list)
    min_value: float | None = None
    max_value: float | None = None
    visible_when: dict[str, Any] | None = None
    advanced: bool = False
    option_packs: dict[str, str] | None = None


def is_param_visible(definition: ParamDefinition, params: dict[str, Any] | None) -> bool:
    """Whether the editor shows ``definition`` for ``params``: every ``visible_when`` key matches (a list:
    any of its values), compared as strings."""
    rule = definition.visible_when
    if not rule:
        return True
    live = params or {}
    for sibling, expected in rule.items():
        accepted = expected if isinstance(expected, list) else [expected]
        if not any(str(c) == str(live.get(sibling)) for c in accepted):
            return False
    return True


_LEADING_INT = re.compile(r"\s*([+-]?[0-9]+)")


def resolve_count_param(params: dict[str, Any] | None, name: str, *, default: int, minimum: int,
                        maximum: int) -> int:
    """A param that sets how many ports a node has, read as the editor reads it (a leading integer; a bool or
    nothing readable: ``default``) and clamped to ``[minimum, maximum]``."""
    raw = (params or {}).get(name, default)
    parsed: int | None
    if isinstance(raw, bool):
        parsed = None
    elif isinstance(raw, (int, float)):
        parsed = math.floor(raw) if math.isfinite(raw) else None
    else:
        m = _LEADING_INT.match("" if raw is None else str(raw))
        parsed = int(m.group(1)) if m else None
    return max(minimum, min(maximum, default if parsed is None else parsed))


class BaseNode(ABC):
    NODE_NAME: str = ""
    CATEGORY: str = ""
    DESCRIPTION: str = ""
    cacheable: ClassVar[bool] = True
    align_inputs: ClassVar[bool] = True
    REQUIRES_PACK: ClassVar[str | None] = None

    @classmethod
    def cache_fingerprint(cls, params: dict[str, Any]) -> Any:
        return None

    @classmethod
    @abstractmethod
    def define_inputs(cls) -> list[PortDefinition]:
        ...

    @classmethod
    @abstractmethod
    def define_outputs(cls) -> list[PortDefinition]:
        ...

    @classmethod
    def define_outputs_dynamic(cls, params: dict[str, Any] | None = None) -> list[PortDefinition]:
        return cls.define_outputs()

    @classmethod
    def define_inputs_dynamic(cls, params: dict[str, Any] | None = None) -> list[PortDefinition]:
        return cls.define_inputs()

    @classmethod
    def define_params(cls) -> list[ParamDefinition]:
        return []

    @abstractmethod
    def execute(self, inputs: dict[str, Any], params: dict[str, Any], progress_callback: Any | None = None,
                *, context: Any = None) -> dict[str, Any]:
        ...


class StatefulModuleMixin:
    """A node that wraps one ``torch.nn.Module``: :meth:`get_or_build_module` gives the module this graph
    node built earlier in the run for the same ``structural_params`` values, else a new one from
    :meth:`build_module`, on the run's device."""

    structural_params: ClassVar[tuple[str, ...]] = ()
    cacheable: ClassVar[bool] = False

    def build_module(self, params: dict[str, Any]) -> Any:
        # CodefyUI's abstract hook: every stateful node class defines it; reaching this one is the pack's error.
        raise TypeError(f"{type(self).__name__} uses StatefulModuleMixin but defines no build_module(params) "
                        "returning its torch.nn.Module; the plugin pack's node must define it")

    def _normalise_for_hash(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(params)

    def _structure_hash(self, params: dict[str, Any]) -> str:
        keys = self.structural_params or tuple(sorted(params))
        payload = json.dumps(self._normalise_for_hash({k: params.get(k) for k in keys}), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def get_or_build_module(self, context: Any, params: dict[str, Any]) -> Any:
        run = getattr(context, "run_context", None)
        if run is None:
            module = self.build_module(params)
        else:
            module = run.node_module((run.node_id or "", self._structure_hash(params)),
                                     lambda: self.build_module(params))
        device = getattr(context, "device", None)
        if device and hasattr(module, "to"):
            module = module.to(device)
        return module


# -- app.core.seeding: run-scoped seeds, as CodefyUI's packs (edu's layer seeding) call them ----------------
SEED_SPACE = 2 ** 32
MAX_SEED = SEED_SPACE - 1


def derive_seed(run_seed: int, label: str) -> int:
    """A child seed for ``label`` under ``run_seed``, the same in every process (a BLAKE2b digest of the two,
    8 bytes, big-endian, modulo 2**32: CodefyUI's derivation, so a pack's seeded weights match its own)."""
    digest = hashlib.blake2b(f"{int(run_seed)}\x00{label}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_SPACE


def seed_rngs(seed: int | None) -> None:
    """Seed Python's and torch's generators from ``seed`` (None: leave them)."""
    if seed is None:
        return
    import torch
    random.seed(int(seed) % SEED_SPACE)
    torch.manual_seed(int(seed) % SEED_SPACE)


def make_generator(seed: int | None) -> Any:
    """A CPU ``torch.Generator`` seeded with ``seed``, or None."""
    if seed is None:
        return None
    import torch
    gen = torch.Generator()
    gen.manual_seed(int(seed) % SEED_SPACE)
    return gen


def seeded_linear_init(module: Any, seed: int) -> Any:
    """Give every ``nn.Linear`` of ``module`` torch's default initialisation drawn from a generator seeded with
    ``seed`` alone (weights: Kaiming-uniform with a=sqrt(5); biases: uniform in +-1/sqrt(fan_in)), layer by
    layer in ``modules()`` order; a parameter that is not a Linear's is refused (nothing would seed it)."""
    import torch
    from torch import nn
    layers = [m for m in module.modules() if isinstance(m, nn.Linear)]
    ours = {id(p) for layer in layers for p in (layer.weight, layer.bias) if p is not None}
    for name, param in module.named_parameters():
        if id(param) not in ours:
            raise ValueError(f"seeded_linear_init: {name!r} is not the weight or bias of an nn.Linear")
    gen = torch.Generator()
    gen.manual_seed(int(seed))
    with torch.no_grad():
        for layer in layers:
            nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=gen)
            if layer.bias is not None:
                fan_in = layer.weight.size(1)
                bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
                nn.init.uniform_(layer.bias, -bound, bound, generator=gen)
    return module


class ExecutionContext:
    """What a CodefyUI node's ``execute(..., context=)`` reads.

    Built two ways. cdui builds it for each node call from the run's context (:meth:`for_run`), so that it
    reports warnings and log lines into the run and keeps a stateful node's module for the run. A pack's
    own code or tests build it as CodefyUI's dataclass is built, by keyword (``ExecutionContext(device="cpu",
    verbose=True, seed=7)``): then it stands alone, with CodefyUI's defaults, a stop flag of its own, and
    nowhere to report to but the ``cdui.plugins`` log.
    """

    def __init__(self, run_context: RunContext | None = None, *, device: str = "cpu", verbose: bool = False,
                 seed: int | None = None, deterministic: bool = False, graph_id: str = "",
                 execution_id: str = "", current_node_id: str = "", weights_persistent: bool = True,
                 node_state_store: Any = None, backward_mode: bool = False, auto_backward: bool = False,
                 max_workers: int = 4) -> None:
        self.run_context = run_context
        self.device = device
        self.verbose = verbose
        self.seed = seed
        self.deterministic = deterministic
        self.graph_id = graph_id
        self.execution_id = execution_id
        self.current_node_id = current_node_id
        self.weights_persistent = weights_persistent
        self.node_state_store = node_state_store
        self.backward_mode = backward_mode
        self.auto_backward = auto_backward
        self.max_workers = max_workers
        self.grad_targets: dict[tuple[str, str], Any] = {}
        self._stopped = False

    @classmethod
    def for_run(cls, ctx: RunContext) -> ExecutionContext:
        """The context of one node call of a cdui run. Weights live for the run only (the module a node
        built is kept while the run lasts), and a cdui run takes no run seed."""
        return cls(ctx, device=str(ctx.device or "cpu"), verbose=bool(getattr(ctx, "verbose", False)),
                   graph_id=ctx.run_id, execution_id=ctx.run_id, current_node_id=ctx.node_id or "",
                   weights_persistent=False)

    def derive_seed(self, label: str) -> int | None:
        """The seed of ``label`` under the run's seed; None on an unseeded run (every cdui run: packs then
        fall back to their own seeding, as CodefyUI's do)."""
        return None if self.seed is None else derive_seed(self.seed, label)

    def make_generator(self, label: str) -> Any:
        return make_generator(self.derive_seed(label))

    def log_warning(self, kind: str, message: str, node_id: str | None = None, **data: Any) -> None:
        if self.run_context is not None:
            self.run_context.warning(kind, message, **data)
        else:
            log.warning("%s: %s", kind, message)

    def log(self, message: str, level: str = "info") -> None:
        if self.run_context is not None:
            self.run_context.log(message, level)
        else:
            log.log(_LOG_LEVELS.get(level, logging.INFO), "%s", message)

    def cancel(self) -> None:
        self._stopped = True

    @property
    def cancelled(self) -> bool:
        return self.should_stop()

    def should_stop(self) -> bool:
        return self._stopped or (self.run_context is not None and self.run_context.should_stop())


def _enum_value(v: Any) -> str:
    return str(v.value if isinstance(v, Enum) else v)


def _port(p: Any) -> Port:
    return Port(str(p.name), _enum_value(p.data_type), str(getattr(p, "description", "") or ""),
                bool(getattr(p, "optional", False)))


def _param(p: Any) -> Param:
    return Param(str(p.name), _enum_value(p.param_type), getattr(p, "default", None),
                 str(getattr(p, "description", "") or ""), list(getattr(p, "options", None) or []),
                 getattr(p, "min_value", None), getattr(p, "max_value", None),
                 advanced=bool(getattr(p, "advanced", False)),
                 visible_when=dict(p.visible_when) if getattr(p, "visible_when", None) else None)


def _takes_context(fn: Any) -> tuple[bool, bool]:
    """Whether ``fn`` (an execute) takes ``context`` and a ``progress_callback`` (older nodes take neither)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True, True
    names = set(sig.parameters)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    positional = [p for p in sig.parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return ("context" in names or var_kw), len(positional) >= 4  # self, inputs, params, progress_callback


def _progress(ctx: RunContext) -> Any:
    """A node's ``progress_callback``: CodefyUI's nodes call it with the fraction done (``cb(epoch / epochs)``)
    or keywords; reported as ``progress`` events, a fraction at most once per percent."""
    last = [-1.0]

    def report(*args: Any, **kwargs: Any) -> None:
        if kwargs:
            ctx.progress(**kwargs)
        elif args and isinstance(args[0], (int, float)) and not isinstance(args[0], bool):
            f = float(args[0])
            if f >= last[0] + 0.01 or f >= 1.0 > last[0]:
                last[0] = f
                ctx.progress(event="fraction", fraction=round(f, 4))
    return report


def adapt(cls: Any, type_name: str, pack: str) -> type[Node]:
    """A cdui node type named ``type_name`` that runs CodefyUI node class ``cls`` of pack ``pack``."""
    with_context, with_progress = _takes_context(cls.__dict__.get("execute") or cls.execute)

    def define_inputs(_c: type[Node]) -> list[Port]:
        return [_port(p) for p in cls.define_inputs()]

    def define_outputs(_c: type[Node]) -> list[Port]:
        return [_port(p) for p in cls.define_outputs()]

    def define_params(_c: type[Node]) -> list[Param]:
        return [_param(p) for p in cls.define_params()]

    def execute(self: Node, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        node = cls()
        args: list[Any] = [inputs, params]
        if with_progress:
            args.append(_progress(ctx))
        kwargs = {"context": ExecutionContext.for_run(ctx)} if with_context else {}
        out: dict[str, Any] = node.execute(*args, **kwargs)
        return out

    attrs: dict[str, Any] = {
        "NODE_NAME": type_name, "CATEGORY": str(getattr(cls, "CATEGORY", "") or ""),
        "DESCRIPTION": str(getattr(cls, "DESCRIPTION", "") or ""),
        "CACHEABLE": bool(getattr(cls, "cacheable", True)),
        "STRUCTURAL_PARAMS": tuple(getattr(cls, "structural_params", ()) or ()),
        "CODEFYUI_CLASS": cls, "PACK": pack,
        "define_inputs": classmethod(define_inputs), "define_outputs": classmethod(define_outputs),
        "define_params": classmethod(define_params), "execute": execute,
        "__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}[cdui]",
    }
    return type(f"{cls.__name__}_cdui", (Node,), attrs)


def is_codefyui_node(value: Any, module_name: str) -> bool:
    """A node class a CodefyUI pack's module defines (not one it imported)."""
    return (isinstance(value, type) and issubclass(value, BaseNode) and value is not BaseNode
            and bool(getattr(value, "NODE_NAME", "")) and value.__module__ == module_name
            and not inspect.isabstract(value))


# -- app.nodes.diffusion._resblock_module: the residual block CodefyUI's deep pack builds its Edu-ResBlock from --
_RESBLOCK: list[Any] = []


def _resblock_class() -> Any:
    """The diffusion residual block as CodefyUI's backend defines it, for packs that import it: GroupNorm,
    SiLU, 3x3 conv (in -> out channels), plus a linear projection of an optional time embedding added per
    channel, GroupNorm, SiLU, 3x3 conv, and the input added back (through a 1x1 conv when the channel count
    changes). ``seed`` fixes its weights: a generator seeded with it draws conv1's, conv2's, the projection's
    and the 1x1 skip's weights in that order, each normal with standard deviation 1/sqrt(in_channels), and
    every bias is zero; so the same params give the same block there and here. Built on first use (torch is
    imported then, not when the compatibility modules are installed)."""
    if _RESBLOCK:
        return _RESBLOCK[0]
    import torch
    from torch import nn
    from torch.nn import functional

    class ResBlock(nn.Module):
        def __init__(self, in_channels: int, out_channels: int, groups: int, time_emb_dim: int,
                     seed: int) -> None:
            super().__init__()
            self.in_channels, self.out_channels, self.time_emb_dim = in_channels, out_channels, time_emb_dim
            # Made in this order, so that the global generator advances as it does for CodefyUI's.
            self.norm1 = nn.GroupNorm(groups, in_channels)
            self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
            self.time_proj = nn.Linear(time_emb_dim, out_channels) if time_emb_dim > 0 else None
            self.norm2 = nn.GroupNorm(groups, out_channels)
            self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
            self.skip = (nn.Conv2d(in_channels, out_channels, kernel_size=1) if in_channels != out_channels
                         else nn.Identity())
            drawn = torch.Generator()
            drawn.manual_seed(int(seed))
            std = 1.0 / math.sqrt(max(in_channels, 1))
            with torch.no_grad():
                layers: list[Any] = [self.conv1, self.conv2, self.time_proj,
                                     self.skip if isinstance(self.skip, nn.Conv2d) else None]
                for layer in layers:
                    if layer is not None:
                        layer.weight.copy_(torch.randn(layer.weight.shape, generator=drawn) * std)
                        layer.bias.zero_()

        def forward(self, x: Any, time_emb: Any = None) -> Any:
            h = self.conv1(functional.silu(self.norm1(x)))
            if time_emb is not None and self.time_proj is not None:
                h = h + self.time_proj(time_emb)[:, :, None, None]
            h = self.conv2(functional.silu(self.norm2(h)))
            return h + self.skip(x)

    ResBlock.__name__ = ResBlock.__qualname__ = "_ResBlockModule"
    _RESBLOCK.append(ResBlock)
    return ResBlock


def _resblock_module_attr(name: str) -> Any:
    if name == "_ResBlockModule":
        return _resblock_class()
    raise AttributeError(f"module 'app.nodes.diffusion._resblock_module' has no attribute {name!r} in cdui "
                         "(cdui/nodes/codefyui_compat.py provides _ResBlockModule only)")


# The modules a CodefyUI node file imports, and what each holds.
_MODULES: dict[str, dict[str, Any]] = {
    "app.core.node_base": {
        "BaseNode": BaseNode, "PortDefinition": PortDefinition, "ParamDefinition": ParamDefinition,
        "DataType": DataType, "ParamType": ParamType, "MEDIA_IMAGE": MEDIA_IMAGE, "MEDIA_CHART": MEDIA_CHART,
        "MEDIA_VIDEO": MEDIA_VIDEO, "is_param_visible": is_param_visible,
        "resolve_count_param": resolve_count_param},
    "app.core.step_trace": {"Step": Step, "StepRecorder": StepRecorder},
    "app.core.stateful_module": {"StatefulModuleMixin": StatefulModuleMixin},
    "app.core.execution_context": {"ExecutionContext": ExecutionContext},
    "app.core.seeding": {"SEED_SPACE": SEED_SPACE, "MAX_SEED": MAX_SEED, "derive_seed": derive_seed,
                         "seed_rngs": seed_rngs, "make_generator": make_generator,
                         "seeded_linear_init": seeded_linear_init},
    # Looked up when a pack imports it (module __getattr__): the class needs torch, the control plane need not.
    "app.nodes.diffusion._resblock_module": {"__getattr__": _resblock_module_attr},
}
MODULE_NAMES = tuple(_MODULES)


def install_modules() -> None:
    """Provide CodefyUI's module names in ``sys.modules``, where nothing else already does."""
    for name, content in _MODULES.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            if pkg not in sys.modules:
                m = types.ModuleType(pkg, "CodefyUI's backend names, provided by cdui for plugin packs")
                m.__path__ = []
                sys.modules[pkg] = m
        if name in sys.modules:
            continue
        mod = types.ModuleType(name, f"CodefyUI's {name}, provided by cdui (cdui/nodes/codefyui_compat.py)")
        mod.__dict__.update(content)
        sys.modules[name] = mod
        setattr(sys.modules[".".join(parts[:-1])], parts[-1], mod)
