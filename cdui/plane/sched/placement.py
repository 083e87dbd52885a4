"""Which runs use files, and whether the transfer backend can carry them
(docs/remote-workers.md#which-runs-use-files).

Pure functions: :func:`analyze` reads node declarations (after expanding
presets and the presets a Map runs) into a :class:`~cdui.nodes.base.FileUsage`;
:func:`transfer_verdict` decides whether the control plane can act as the
run's file store, and says why not.

The placement matrix:

- a run that uses no files goes anywhere;
- a run whose file use is only uploads chosen in file fields (and files it
  writes) goes to mounted workers first, then to unmounted ones via transfer;
- anything else (a plain path, an upload this server does not have, inputs
  over ``CODEFYUI_TRANSFER_MAX_INPUT_BYTES``, or transfer disabled) needs a
  mounted worker: a named unmounted worker is refused at submit with
  :func:`no_mount_message`, ``any`` skips unmounted workers.

Absolute paths (``/datasets/...``) are read on the machine that runs the run,
never moved: a run that reads one goes only to an executor whose read roots
(its ``CODEFYUI_READ_ROOTS``; a worker reports them in its ``read-roots``
label) cover every such path (:func:`unreadable`), and a named worker or
``local`` that does not is refused at submit with :func:`read_roots_message`.
"""
from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdui.graph.model import DEFAULT_MAX_NODES, parse
from cdui.nodes.base import FileUsage, file_usage
from cdui.nodes.registry import Registry

GiB = 1024 ** 3


def analyze(graph: Any, registry: Registry, library: dict[str, dict[str, Any]] | None = None,
            max_nodes: int = DEFAULT_MAX_NODES) -> FileUsage:
    g, _ = parse(graph, library, max_nodes)
    usage = FileUsage()
    seen_presets: set[str] = set()
    nodes = list(g.nodes.values())
    while nodes:
        n = nodes.pop()
        cls = registry.get(n.type)
        if cls is None:
            continue
        usage.merge(file_usage(cls, n.params, n.origin))
        for key in cls.preset_params():
            name = n.params.get(key)
            if isinstance(name, str) and name:
                name = name.removeprefix("preset:")
                if name in g.presets and name not in seen_presets:
                    seen_presets.add(name)
                    sub, _ = parse({"nodes": [{"id": n.id, "type": "preset:" + name}], "edges": []}, g.presets,
                                   max_nodes)
                    nodes.extend(sub.nodes.values())
    # The same upload read twice is one input.
    usage.uploads = sorted(set(usage.uploads))
    usage.absolute_reads = sorted(set(usage.absolute_reads))
    return usage


def unreadable(reads: Sequence[str], roots: Sequence[str]) -> list[str]:
    """The absolute paths of ``reads`` that lie under none of ``roots`` (lexically: the machine that
    runs the run checks symbolic links itself, see cdui.core.layout)."""
    def under(path: str, root: str) -> bool:
        p, r = posixpath.normpath(path), posixpath.normpath(root)
        return ".." not in path.split("/") and (p == r or p.startswith(r.rstrip("/") + "/"))
    return [p for p in reads if not any(under(p, r) for r in roots)]


def read_roots_message(executor: str, missing: Sequence[str], roots: Sequence[str]) -> str:
    where = "this server" if executor == "local" else f"worker {executor}"
    return (f"{where} does not allow reading {missing[0]!r}: absolute paths are read only under the folders "
            f"its CODEFYUI_READ_ROOTS lists ({', '.join(roots) or 'none'})")


@dataclass
class FilePlan:
    uses_files: bool
    transfer_ok: bool
    reason: str | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)  # {folder, name, sha256, size}
    writes: bool = False
    reads: list[str] = field(default_factory=list)  # absolute paths, read where the run runs

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"uses_files": self.uses_files, "transfer_ok": self.transfer_ok, "reason": self.reason,
                             "inputs": self.inputs, "writes": self.writes}
        if self.reads:  # only where there are some, so a stored plan without any reads as before
            d["reads"] = self.reads
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> FilePlan:
        d = d or {}
        return cls(bool(d.get("uses_files")), bool(d.get("transfer_ok", True)), d.get("reason"),
                   list(d.get("inputs") or []), bool(d.get("writes")),
                   [str(p) for p in d.get("reads") or []])


def transfer_verdict(usage: FileUsage, lookup: Callable[[str, str], tuple[str, int] | None],
                     enabled: bool, max_bytes: int) -> FilePlan:
    """``lookup(folder, name)`` gives (sha256, size) of an upload this server has, or None."""
    plan = FilePlan(usage.uses_files, True, writes=bool(usage.writes), reads=list(usage.absolute_reads))
    if not usage.uses_files:
        return plan
    reasons = []
    if not enabled:
        reasons.append("the transfer backend is off (CODEFYUI_TRANSFER_ENABLED=0)")
    if usage.plain_paths:
        reasons.append(f"a node reads the plain path {usage.plain_paths[0]!r} "
                       "instead of an upload chosen in a file field")
    total = 0
    for folder, name in usage.uploads:
        found = lookup(folder, name)
        if found is None:
            reasons.append(f"the upload {folder}/{name} does not exist on this server")
            continue
        sha, size = found
        total += size
        plan.inputs.append({"folder": folder, "name": name, "sha256": sha, "size": size})
    if total > max_bytes:
        reasons.append(f"its inputs add up to {total / GiB:.2f} GiB, over the transfer limit of "
                       f"{max_bytes / GiB:.2f} GiB (CODEFYUI_TRANSFER_MAX_INPUT_BYTES)")
    if reasons:
        plan.transfer_ok = False
        plan.reason = "; ".join(reasons)
    return plan


def no_mount_message(worker: str, reason: str | None) -> str:
    return (f"worker {worker} has no `data` mount; add `--mount data=...` to its agent, "
            f"or make the run fit the transfer backend: {reason}")
