"""What a node sees of the run it belongs to.

The run subprocess builds one :class:`RunContext` and hands it to every node's
``execute``. Nodes report through it (logs, metrics, progress, artifacts),
resolve paths through it (never by themselves), and poll
:meth:`RunContext.should_stop` in long loops.
"""
from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdui.core.layout import Layout


class RunStopped(Exception):
    """Raised inside a node when the run was asked to stop."""


class RunContext:
    def __init__(self, run_id: str, layout: Layout, emit: Callable[[str, dict[str, Any]], None],
                 device: str = "cpu", stop_event: threading.Event | None = None) -> None:
        self.run_id = run_id
        self.layout = layout
        self.device = device
        # The run's device set as this process names them (one entry unless the run was given a set).
        self.device_set: list[str] = [device]
        self._emit = emit
        # The emitter's own writer of a log event, where it has one (the run process's pipe):
        # ``log(node_id, message, level)`` writes the event ``emit("log", data)`` would, faster. A run
        # that logs flat out makes hundreds of thousands of them a second.
        self._log: Callable[[str | None, str, Any], None] | None = getattr(emit, "log", None)
        self.stop_event = stop_event or threading.Event()
        self.node_id: str | None = None
        self.node_type: str | None = None
        # Set by the executor: run a preset by name over a dict of inputs.
        self.run_preset: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
        # Files the run wrote (absolute paths), for the transfer backend.
        self.written: list[Path] = []
        # True while the run records node outputs: nodes then also return their ``__steps__``.
        self.verbose = False
        # The modules stateful nodes built in this run, by (node id, structural params): Node.stateful_module.
        self._modules: dict[tuple[str, str], Any] = {}

    def node_module(self, key: tuple[str, str], build: Callable[[], Any]) -> Any:
        """The module kept under ``key`` in this run, built by ``build()`` the first time (one per node id:
        a new structural key for the same node replaces the module it kept)."""
        if key not in self._modules:
            for old in [k for k in self._modules if k[0] == key[0]]:
                del self._modules[old]
            self._modules[key] = build()
        return self._modules[key]

    # -- reporting ------------------------------------------------------
    def emit(self, kind: str, data: dict[str, Any]) -> None:
        if self.node_id and "node_id" not in data:
            data = {"node_id": self.node_id, **data}
        self._emit(kind, data)

    def log(self, message: str, level: str = "info") -> None:
        if self._log is not None:
            self._log(self.node_id, str(message), level)
            return
        self.emit("log", {"message": str(message), "level": level})

    def metric(self, name: str, value: float, step: int | None = None, **extra: Any) -> None:
        self.emit("metric", {"name": name, "value": float(value), "step": step, **extra})

    def progress(self, **data: Any) -> None:
        """Progress of a long node, e.g. ``progress(epoch=3, epochs=10, loss=0.4)``."""
        self.emit("progress", data)

    def warning(self, kind: str, message: str, **data: Any) -> None:
        self.emit("run_warning", {"kind": kind, "message": message, **data})

    def artifact(self, kind: str, path: Path, name: str | None = None) -> None:
        """Record a file (or folder) the run produced: checkpoint, model, tensorboard, output."""
        path = Path(path)
        self.written.append(path)
        self.emit("artifact", {"kind": kind, "path": str(path), "name": name or path.name})

    # -- paths -------------------------------------------------------------
    def resolve(self, value: str) -> Path:
        return self.layout.resolve(value)

    def resolve_upload(self, folder: str, value: str) -> Path:
        return self.layout.resolve_upload(folder, value)

    def output_path(self, folder: str, value: str) -> Path:
        p = self.layout.resolve_output(folder, value)
        p.parent.mkdir(parents=True, exist_ok=True)
        # A file already there may be an earlier run's recorded artifact, whose bytes the control plane
        # keeps as a hard link (cdui/plane/files/artifact_files.py): a node that opens it in place (torch.save does)
        # would change that run's record. So a linked file is unlinked first; the node writes a new one.
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                p.unlink()
        return p

    def run_dir(self) -> Path:
        d = self.layout.run_dir(self.run_id)
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- stopping --------------------------------------------------------
    def should_stop(self) -> bool:
        return self.stop_event.is_set()

    def check_stop(self) -> None:
        if self.stop_event.is_set():
            raise RunStopped()

    def now(self) -> float:
        return time.time()
