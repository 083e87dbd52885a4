"""The job: what a run needs to execute, sent control plane -> agent -> run subprocess.

One frozen value, built once by :class:`cdui.plane.runs.RunService` when the run
starts. Every later step derives its own copy with :func:`dataclasses.replace`
and never changes the one it was given: a remote executor drops the control
plane's paths for another machine, the agent fills in its own layout and
folders, the launcher adds the device the subprocess must use. Each process
edge (the ``assign`` message, the run subprocess's stdin) carries it as JSON
through :meth:`Job.to_json` and reads it back through :meth:`Job.from_json`,
which refuses a job that does not fit its shape.

Secrets travel only inside the job, in memory and on the stdin pipe of the run
subprocess: the field is left out of ``repr`` so that a logged job cannot show
them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from cdui.wire.s3 import check_target

# Variables a zygote (cdui.run.spare) is started without, since they differ per run; the child it forks
# for a run gets them in the fork request and sets them before its job.
DEFERRED_ENV = ("CUDA_VISIBLE_DEVICES",)

Secret = tuple[tuple[Any, ...], Any]  # (path into the graph, value)

BACKENDS = (None, "mount", "transfer", "s3")


class JobError(ValueError):
    """A job that does not fit its shape; the text says which field and what it got."""


def _typed(d: dict[str, Any], key: str, typ: type | tuple[type, ...], default: Any = None,
           required: bool = False) -> Any:
    if key not in d or d[key] is None:
        if required:
            raise JobError(f"job: missing field {key!r}")
        return default
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise JobError(f"job: field {key!r} has type {type(v).__name__}")
    return v


@dataclass(frozen=True)
class JobFiles:
    """Where the run's files live: ``backend`` None (none used), ``mount`` (a shared
    folder offered under ``label``), ``transfer`` (``inputs`` fetched from the
    control plane, outputs uploaded back) or ``s3`` (the same through the bucket
    ``s3`` names: endpoint, region, bucket, prefix, addressing style; see cdui/wire/s3.py)."""

    backend: str | None = None
    inputs: tuple[dict[str, Any], ...] = ()
    label: str = "data"
    s3: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "inputs": [dict(i) for i in self.inputs],
                               "label": self.label}
        if self.s3 is not None:
            out["s3"] = dict(self.s3)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> JobFiles:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise JobError(f"job: field 'files' has type {type(d).__name__}")
        backend = d.get("backend")
        if backend not in BACKENDS:
            raise JobError(f"job: files.backend={str(backend)[:40]!r} is not one of mount, transfer or null")
        inputs = _typed(d, "inputs", list, [])
        if not all(isinstance(i, dict) for i in inputs):
            raise JobError("job: every files.inputs item must be an object")
        s3 = _typed(d, "s3", dict)
        if backend == "s3":
            try:
                s3 = check_target(s3)
            except ValueError as exc:
                raise JobError(f"job: {exc}") from None
        return cls(backend, tuple(inputs), _typed(d, "label", str, "data"), s3)


@dataclass(frozen=True)
class Job:
    run_id: str
    graph: dict[str, Any]
    # The run's submitted options (device wanted, graph_max_nodes, the file plan, ...).
    options: dict[str, Any] = field(default_factory=dict)
    # The slot the run was placed on (``cuda:1``): what events and the run show.
    slot_device: str = "cpu"
    # The device the run subprocess uses: its card is renumbered to ``cuda:0`` there
    # (see :func:`cdui.run.runner.map_slot_device`). None until the launcher sets it.
    process_device: str | None = None
    # Folders as the machine that runs it sees them; None: the agent fills in its own.
    layout: dict[str, Any] | None = None
    custom_nodes_dir: str | None = None
    plugins_dir: str | None = None
    # The installed packs' folder (<user data>/plugins, with the lockfile) on the machine that runs it.
    plugin_store: str | None = None
    files: JobFiles = field(default_factory=JobFiles)
    secrets: tuple[Secret, ...] = field(default=(), repr=False)
    # An s3 run's bucket credentials (cdui.wire.s3.S3Credentials.to_dict()): like secrets, never in a
    # repr; the agent keeps them in memory and takes them out before the job reaches the run process.
    s3_credentials: dict[str, Any] | None = field(default=None, repr=False)
    # The .env secrets of the project the launching machine opened (cdui/core/project.py): added by the
    # launcher on the machine that runs the job, set in the run process's own environment there.
    env_secrets: dict[str, str] = field(default_factory=dict, repr=False)

    def secret_pairs(self) -> list[tuple[list[Any], Any]]:
        """The secrets in the form the masking and filling functions take."""
        return [(list(p), v) for p, v in self.secrets]

    @property
    def graph_max_nodes(self) -> int | None:
        v = self.options.get("graph_max_nodes")
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    def without_local_paths(self) -> Job:
        """The job for another machine, which resolves folders in its own installation."""
        return replace(self, layout=None, custom_nodes_dir=None, plugins_dir=None, plugin_store=None)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "graph": self.graph, "options": self.options,
                "slot_device": self.slot_device, "process_device": self.process_device,
                "layout": self.layout, "custom_nodes_dir": self.custom_nodes_dir, "plugins_dir": self.plugins_dir,
                "plugin_store": self.plugin_store,
                "files": self.files.to_dict(), "secrets": [[list(p), v] for p, v in self.secrets],
                "s3_credentials": self.s3_credentials, "env_secrets": dict(self.env_secrets)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_dict(cls, d: Any) -> Job:
        if not isinstance(d, dict):
            raise JobError(f"a job must be a JSON object, got {type(d).__name__}")
        secrets: list[Secret] = []
        for i, s in enumerate(_typed(d, "secrets", list, [])):
            if not isinstance(s, (list, tuple)) or len(s) != 2 or not isinstance(s[0], (list, tuple)):
                raise JobError(f"job: secrets[{i}] is not a [path, value] pair")
            secrets.append((tuple(s[0]), s[1]))
        env_secrets = _typed(d, "env_secrets", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env_secrets.items()):
            raise JobError("job: env_secrets must map names to strings")
        return cls(run_id=_typed(d, "run_id", str, required=True),
                   graph=_typed(d, "graph", dict, required=True),
                   options=_typed(d, "options", dict, {}),
                   slot_device=_typed(d, "slot_device", str, "cpu"),
                   process_device=_typed(d, "process_device", str),
                   layout=_typed(d, "layout", dict),
                   custom_nodes_dir=_typed(d, "custom_nodes_dir", str),
                   plugins_dir=_typed(d, "plugins_dir", str),
                   plugin_store=_typed(d, "plugin_store", str),
                   files=JobFiles.from_dict(d.get("files")),
                   secrets=tuple(secrets),
                   s3_credentials=_typed(d, "s3_credentials", dict),
                   env_secrets=dict(env_secrets))

    @classmethod
    def from_json(cls, text: str | bytes) -> Job:
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise JobError(f"the job is not JSON: {exc}") from None
        return cls.from_dict(d)
