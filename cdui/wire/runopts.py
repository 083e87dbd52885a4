"""A submit's run options, parsed once where a run is admitted.

``POST /api/runs`` (and ``POST /api/graphs/validate``, ``POST /api/graphs/{name}/run``, ``cdui run``) give
options as a JSON object: ``target`` (see :mod:`cdui.wire.target`), ``device`` (a kind or one CUDA card),
``record_outputs``, and for a device set ``devices`` and ``memory_mb`` (see :mod:`cdui.wire.devicesets`).
:func:`parse_run_options` checks them in that order, each refusal naming the bad value, and gives a
frozen :class:`RunOptions`; :meth:`RunOptions.stored` is what the run's ``options`` column keeps, key for
key as before.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError
from cdui.wire.devicesets import submit_options
from cdui.wire.target import Local, Pool, Target, parse_target, target_json

# A device a run may ask for: a kind, or one CUDA card by its index (cuda:0 ... cuda:999).
DEVICE_NAME = re.compile(r"^(auto|cpu|mps|cuda|cuda:(0|[1-9][0-9]{0,2}))$")


@dataclass(frozen=True)
class RunOptions:
    target: Target = field(default_factory=Local)
    device: str = "auto"
    record_outputs: bool = False
    devices: int = 1                 # the size of the device set it asks for (1: one device, as usual)
    memory_mb: int | None = None     # its need on each device shared by memory (None: the default)

    def device_set(self) -> dict[str, int]:
        """The set size and memory need as the run's options keep them: nothing when it asked for
        neither, so a plain run's options are as they always were."""
        out: dict[str, int] = {}
        if self.devices > 1:
            out["devices"] = self.devices
        if self.memory_mb is not None:
            out["memory_mb"] = self.memory_mb
        return out

    def stored(self, files: dict[str, Any], has_secrets: bool, graph_max_nodes: int) -> dict[str, Any]:
        """The run's ``options`` column (and the ``options`` that ``GET /api/runs/{id}`` shows)."""
        return {"target": target_json(self.target), "device": self.device, "record_outputs": self.record_outputs,
                "files": files, "has_secrets": has_secrets, "graph_max_nodes": graph_max_nodes,
                **self.device_set()}


def parse_run_options(raw: object) -> RunOptions:
    """The options of a submit (None: every default), or :class:`CduiError` naming the first bad one."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CduiError("bad_options", f"options must be an object, got {type(raw).__name__}")
    target = parse_target(raw.get("target", "local"))
    device = raw.get("device") or "auto"
    # Only names a device can have: "cuda:-1" or "cpu:x" would wait in the queue for ever.
    if not isinstance(device, str) or not DEVICE_NAME.match(device):
        raise CduiError("bad_device", f"device {device!r} is not valid", hint="use cpu, cuda, cuda:N or auto")
    record_outputs = raw.get("record_outputs", False)
    if not isinstance(record_outputs, bool):
        raise CduiError("bad_options", f"record_outputs={record_outputs!r} is not true or false",
                        hint='give "record_outputs": true to keep the run\'s outputs, or leave it out')
    asked = submit_options(raw, device, isinstance(target, Pool))
    return RunOptions(target, device, record_outputs, asked.get("devices", 1), asked.get("memory_mb"))
