"""What a node is: typed ports, typed params, file semantics, and ``execute``.

Port and param names, types and defaults follow CodefyUI's node library so its
graphs run unchanged. The *file semantics* later parts of cdui need (does this
run read uploads, write files, read plain paths?) are derived from these
declarations alone (:func:`file_usage`), never from a list of node names:

- a param of type ``data_file`` / ``image_file`` / ``model_file`` is an upload
  field (it reads ``data/files``, ``data/images`` or ``data/models``);
- a param of type ``path`` reads a plain file path, ``folder`` a plain folder;
- a param of type ``output_path`` names a file the node writes, relative to the
  node's ``WRITES_TO`` folder (``models`` or ``output``);
- a param declared with ``writes=True`` makes the node write files (into the
  run folder) whenever its value is truthy (TrainingLoop's ``checkpoint_every``,
  ``checkpoint_every_steps``, ``tensorboard``).

Which params name a preset the node runs (Map's ``subgraph``) is declared the
same way, with ``runs_preset=True``: validation, placement and the presets a
run brings along read that flag, never a param's name, so a node's own param
that happens to be called ``preset`` (Conv2dKernel's built-in filters) is
just a value.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from cdui.core.layout import Layout
    from cdui.graph.context import RunContext

# Port data types (CodefyUI's DataType values).
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
DATA_TYPES = {TENSOR, MODEL, DATASET, DATALOADER, OPTIMIZER, LOSS_FN, SCALAR,
              STRING, IMAGE, LIST, ANY, TRIGGER, TRANSFORM}

# Param types: CodefyUI's ParamType values plus cdui's file-semantics types.
PARAM_TYPES = {
    "int", "float", "string", "bool", "select", "model_file", "image_file",
    "data_file", "tensor_grid", "secret", "code", "json",
    # cdui additions (see module docstring)
    "path", "folder", "output_path",
}
UPLOAD_FOLDERS = {"data_file": "files", "image_file": "images", "model_file": "models"}


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass
class Port:
    name: str
    data_type: str = ANY
    description: str = ""
    optional: bool = False


@dataclass
class Param:
    name: str
    param_type: str
    default: Any = None
    description: str = ""
    options: list[str] = field(default_factory=list)
    min_value: float | None = None
    max_value: float | None = None
    required: bool = False
    # True: a truthy value makes the node write files (see module docstring).
    writes: bool = False
    advanced: bool = False
    # True: the value is the name of a preset the node runs (see module docstring).
    runs_preset: bool = False
    # What the node gets when a graph leaves the param out, where CodefyUI's node falls back
    # to something other than ``default`` (the value a new node starts with in the editor):
    # TextInput's text is "" then, not its sample sentence. UNSET: ``default``.
    absent: Any = UNSET
    # Shown in the editor only while another param of the node has one of these values, as CodefyUI
    # declares it: {"preset": "Custom"} (a list of values: any of them). Display only; runs ignore it.
    visible_when: dict[str, Any] | None = None

    def when_absent(self) -> Any:
        """The value a graph that leaves this param out runs with."""
        return self.default if self.absent is UNSET else self.absent

    def to_json(self) -> dict[str, Any]:
        d = {"name": self.name, "type": self.param_type, "default": self.default,
             "description": self.description}
        if self.options:
            d["options"] = list(self.options)
        if self.min_value is not None:
            d["min"] = self.min_value
        if self.max_value is not None:
            d["max"] = self.max_value
        if self.required:
            d["required"] = True
        if self.writes:
            d["writes"] = True
        if self.runs_preset:
            d["runs_preset"] = True
        if self.visible_when:
            d["visible_when"] = dict(self.visible_when)
        return d


class Node(ABC):
    """Base class of every node. Subclasses set the class attributes and
    implement :meth:`execute`; one instance is created per graph node."""

    NODE_NAME: ClassVar[str] = ""
    CATEGORY: ClassVar[str] = ""
    DESCRIPTION: ClassVar[str] = ""
    # Data folder that ``output_path`` params are relative to ("models", "output").
    WRITES_TO: ClassVar[str | None] = None
    # Packages beyond torch the node imports (import names), and the cdui extra
    # that installs them (pyproject's optional-dependencies): a node whose
    # packages are missing stays in the catalog, marked unavailable with the
    # install command, and a graph using it is refused at validation.
    NEEDS: ClassVar[tuple[str, ...]] = ()
    EXTRA: ClassVar[str | None] = None
    # A data folder ("media") every run of this node writes into, whatever its
    # params (plot nodes keep their picture): the run's file plan says it writes.
    ALWAYS_WRITES: ClassVar[str | None] = None
    # Whether the canvas's execution cache may answer for this node instead of running it (docs/canvas.md).
    # False for a node whose outputs are not a function of its params and inputs alone: training, random
    # draws from the process's generator, weights initialised on each run, the network, a live object
    # training changes in place, or a side effect that is the node's point. None: decided from the
    # declarations (see :meth:`cacheable`). What is downstream of a node that is not cacheable re-runs too.
    CACHEABLE: ClassVar[bool | None] = None
    # The params that decide the shape of the module a node builds (see :meth:`stateful_module`): a change of
    # any of them builds a fresh module, a change of another param keeps the one built earlier in the run.
    STRUCTURAL_PARAMS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return []

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return []

    @classmethod
    def define_params(cls) -> list[Param]:
        return []

    @classmethod
    def preset_params(cls) -> tuple[str, ...]:
        """The params whose value names a preset this node runs (declared ``runs_preset``)."""
        return tuple(p.name for p in cls.define_params() if p.runs_preset)

    @classmethod
    def cacheable(cls) -> bool:
        """:attr:`CACHEABLE`, or when unset: not for a node that writes files or hands back a model or an
        optimizer (live objects training changes in place); cacheable otherwise."""
        if cls.CACHEABLE is not None:
            return cls.CACHEABLE
        if cls.ALWAYS_WRITES or cls.WRITES_TO:
            return False
        if any(p.param_type == "output_path" or p.writes for p in cls.define_params()):
            return False
        return not any(p.data_type in (MODEL, OPTIMIZER) for p in cls.define_outputs())

    @classmethod
    def reads_outside(cls, params: dict[str, Any], layout: Layout) -> list[Path]:
        """Files or folders the node reads that no file param (``data_file``, ``path``, ``folder``, ...)
        names, e.g. a dataset's own folder under a ``data_dir`` string: the canvas cache keys the node by
        their sizes and mtimes too, so an edit there makes it run again (docs/canvas.md)."""
        return []

    @classmethod
    def missing_packages(cls) -> list[str]:
        """The packages of :attr:`NEEDS` this Python cannot import."""
        return [name for name in cls.NEEDS if not package_available(name)]

    @classmethod
    def preflight(cls, params: dict[str, Any], layout: Layout) -> list[tuple[str, str]]:
        """What this node needs on the machine that runs it and does not find
        there, as ``(code, message)`` pairs; checked at validation on that
        machine, so a graph is refused before any node runs (a package of an
        extra that is not installed; a dataset whose files are missing)."""
        missing = cls.missing_packages()
        if missing:
            return [("missing_extra", f"needs {', '.join(PIP_NAMES.get(m, m) for m in missing)}, which "
                     f"{'is' if len(missing) == 1 else 'are'} not installed on this machine: "
                     f"{install_hint(cls.EXTRA)}")]
        return []

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[tuple[str, str]]:
        """``(param, message)`` for each param value this node can never run with, found without running
        it (a shape of negative or too many dims); checked at validation wherever a graph is validated,
        so such a graph is refused at submit with the param named instead of failing once it runs."""
        return []

    @abstractmethod
    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        """Compute this node's outputs (port name -> value) from its inputs and params.

        A node may add ``"__steps__"``: a list of :class:`Step` (a :class:`StepRecorder`'s ``steps``) naming
        the intermediate values of its computation. They are recorded with the node's outputs (a run with
        recorded outputs sets ``ctx.verbose``, so a node can skip the work otherwise) and never reach a port."""

    def stateful_module(self, ctx: RunContext, params: dict[str, Any], build: Callable[[], Any]) -> Any:
        """The module this graph node built earlier in the run for the same :attr:`STRUCTURAL_PARAMS` values
        (so a node run many times, inside Map or a loop, keeps its weights), else ``build()``'s, kept for the
        next call. Keyed by the node's id: two nodes of one type never share one."""
        names = self.STRUCTURAL_PARAMS or tuple(sorted(params))
        shape = json.dumps({k: params.get(k) for k in names}, sort_keys=True, default=str)
        return ctx.node_module((ctx.node_id or "", shape), build)

    # -- catalog ---------------------------------------------------------
    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "type": cls.NODE_NAME,
            "category": cls.CATEGORY,
            "description": cls.DESCRIPTION,
            "inputs": [{"name": p.name, "type": p.data_type, "optional": p.optional,
                        "description": p.description} for p in cls.define_inputs()],
            "outputs": [{"name": p.name, "type": p.data_type,
                         "description": p.description} for p in cls.define_outputs()],
            "params": [p.to_json() for p in cls.define_params()],
            "writes_to": cls.WRITES_TO,
            **cls._availability(),
        }

    @classmethod
    def _availability(cls) -> dict[str, Any]:
        if not cls.NEEDS:
            return {"available": True}
        missing = cls.missing_packages()
        out: dict[str, Any] = {"available": not missing, "extra": cls.EXTRA,
                               "needs": [PIP_NAMES.get(m, m) for m in cls.NEEDS]}
        if missing:
            out["install"] = install_hint(cls.EXTRA)
        return out


@dataclass
class Step:
    """One named step inside a node's computation (``__steps__``): its description, the tensors (or other
    values) it produced and the numbers worth showing."""
    name: str
    description: str = ""
    tensors: dict[str, Any] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)


class StepRecorder:
    """Collects :class:`Step` s: ``rec.record("scores", "Q @ K.T", scalars={"d": 8.0}, scores=s)``."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def record(self, name: str, description: str = "", *, scalars: dict[str, float] | None = None,
               **tensors: Any) -> None:
        self.steps.append(Step(str(name), str(description), dict(tensors), dict(scalars or {})))

    def __len__(self) -> int:
        return len(self.steps)


# Import name -> pip name, where they differ.
PIP_NAMES = {"sklearn": "scikit-learn", "PIL": "Pillow"}
_AVAILABLE: dict[str, bool] = {}
_PATHS_SEEN: list[tuple[str, int]] = []  # (sys.path entry, its mtime) when _AVAILABLE was filled


def _paths_now() -> list[tuple[str, int]]:
    out = []
    for entry in sys.path:
        try:
            out.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            out.append((entry, -1))
    return out


def package_available(name: str) -> bool:
    """Whether ``name`` can be imported here (without importing it). Looked up once, until a folder of
    ``sys.path`` changes: an extra installed (`bin/cdui install --extras X`, pip) into a running server's or
    agent's environment counts from the next check on, with no restart (runs already running keep what
    they started with)."""
    global _PATHS_SEEN
    now = _paths_now()
    if now != _PATHS_SEEN:
        _AVAILABLE.clear()
        importlib.invalidate_caches()
        _PATHS_SEEN = now
    if name not in _AVAILABLE:

        try:
            _AVAILABLE[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            _AVAILABLE[name] = False
    return _AVAILABLE[name]


def forget_package_lookups() -> None:
    """Look packages up again from now on: a process forked from one that looked them up (a run forked by
    its zygote, cdui/run/zygote.py) must see an extra installed since, as a fresh process would. Python's
    own path caches stay warm, and notice a changed folder by itself."""
    _AVAILABLE.clear()


def install_hint(extra: str | None) -> str:
    if extra is None:
        return "install the packages into cdui's environment"
    return (f"install the {extra} extra with `bin/cdui install --extras {extra}` (a running server or agent "
            f"sees it without a restart) or `bin/cdui start --extras {extra}`; offline: `bin/cdui wheelhouse DIR "
            f"--extras {extra}` on a connected machine, then `bin/cdui install --wheelhouse DIR --extras {extra}`")


@dataclass
class FileUsage:
    """How one node (or a whole graph) touches files."""
    uploads: list[tuple[str, str]] = field(default_factory=list)  # (folder, name)
    plain_paths: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)  # human-readable reasons
    # Absolute paths it reads (under a machine's CODEFYUI_READ_ROOTS): read where the run runs, never moved,
    # so they decide where a run may go, not how its files travel.
    absolute_reads: list[str] = field(default_factory=list)

    @property
    def uses_files(self) -> bool:
        return bool(self.uploads or self.plain_paths or self.writes)

    def merge(self, other: FileUsage) -> None:
        self.uploads.extend(other.uploads)
        self.plain_paths.extend(other.plain_paths)
        self.writes.extend(other.writes)
        self.absolute_reads.extend(other.absolute_reads)


def upload_name(folder: str, value: str) -> str | None:
    """The upload a file-field value names, or None if it is not an upload.

    A file field holds a path relative to its upload folder (``train.csv``,
    ``iris/model.pt``) or a path ``data/<folder>/<name>``. Built-in samples
    (``data/samples/...``) and other ``data/...`` folders are not uploads.
    """
    v = value.replace("\\", "/").strip()
    if not v:
        return None
    prefix = f"data/{folder}/"
    if v.startswith(prefix):
        return v[len(prefix):]
    if v.startswith("data/") or v.startswith("/"):
        return None
    return v


def file_usage(node_cls: type[Node], params: dict[str, Any], node_id: str = "") -> FileUsage:
    usage = FileUsage()
    if node_cls.ALWAYS_WRITES:
        usage.writes.append(f"{node_id or node_cls.NODE_NAME} writes into data/{node_cls.ALWAYS_WRITES}/")
    for p in node_cls.define_params():
        value = params.get(p.name, p.default)
        if p.param_type in UPLOAD_FOLDERS:
            if isinstance(value, str) and value.strip():
                folder = UPLOAD_FOLDERS[p.param_type]
                name = upload_name(folder, value)
                if name is not None:
                    usage.uploads.append((folder, name))
                elif value.strip().startswith("/"):
                    usage.absolute_reads.append(value.strip())
                elif not value.replace("\\", "/").startswith("data/samples/"):
                    usage.plain_paths.append(value)
        elif p.param_type in ("path", "folder"):
            if isinstance(value, str) and value.strip().startswith("/"):
                usage.absolute_reads.append(value.strip())
            elif isinstance(value, str) and value.strip() and not value.startswith("data/samples/"):
                usage.plain_paths.append(value)
        elif p.param_type == "output_path":
            if isinstance(value, str) and value.strip():
                usage.writes.append(f"{node_id or node_cls.NODE_NAME} writes {value!r}")
        if p.writes and value not in (None, "", 0, False, "0", "false"):
            usage.writes.append(f"{node_id or node_cls.NODE_NAME}.{p.name}={value!r}")
    return usage
