"""Files of runs on a worker: what every kind shares, the machine's own installation, and the ``data`` mount.

Each kind implements :class:`cdui.wire.file_backend.FileBackend`; the agent
builds one per run from the job's ``files.backend``
(:func:`cdui.agent.run_files.run_files`) and never asks which kind it holds:

- ``None`` (the run uses no files): :class:`OwnInstallFiles`, the agent's own
  installation layout;
- ``mount``: :class:`MountFiles`, the folder the agent declared with
  ``--mount data=PATH``; artifacts are reported relative to it (``backend: "mount"``);
- ``transfer``: :class:`cdui.agent.transfer_agent.TransferFiles`, a folder of
  the run's own, inputs fetched from the control plane and outputs uploaded to it;
- ``s3``: :class:`cdui.agent.s3_agent.S3Files`, the same through a bucket.

An agent on the control plane's own machine gets the control plane's layout in
the job and uses it whatever the kind (:meth:`Files._same_machine`).
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from cdui.core.config import Config
from cdui.core.layout import Layout
from cdui.core.paths import sha256_file
from cdui.core.project import MANIFEST
from cdui.wire.file_backend import StopCount
from cdui.wire.job import Job


class Unreachable(Exception):
    """The control plane (or the bucket) could not be reached (worth retrying)."""


class Refused(Exception):
    """The control plane (or the bucket) answered no (not worth retrying)."""


def describe(path: Path) -> tuple[int, str | None]:
    """Size and sha256 of a file; a folder's total size and no hash."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()), None
    return sha256_file(path)


# What an artifact event names is looked up on disk in a thread (these three), never on the event
# loop, which carries every run's events and the connection's heartbeats: a folder artifact may
# hold many files, and the disk may be slow.
def inside_of(path: Path, folder: Path) -> Path | None:
    """``path`` relative to ``folder``, links resolved; None when it lies outside."""
    try:
        return path.resolve().relative_to(folder.resolve())
    except ValueError:
        return None


def describe_if_there(path: Path) -> tuple[int | None, str | None]:
    return describe(path) if path.exists() else (None, None)


def files_of(path: Path) -> list[Path]:
    """The artifact's files: itself, or every file in the folder it is."""
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


class Files:
    """What every kind shares: the job for this machine, and nothing to do at the other steps."""

    kind: str | None = None

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.data_dir: Path | None = None

    def job_for_this_machine(self, job: Job, cfg: Config) -> Job:
        # Absolute paths are read under this agent's own read roots, whoever sent the layout.
        roots = cfg.layout.read_roots
        if job.layout is not None:
            # an agent on the control plane's own machine: its folders are the control plane's
            same = Layout.from_json(job.layout)
            self._same_machine(same)
            return replace(job, layout=replace(same, read_roots=roots).to_json(), s3_credentials=None)
        layout = self._layout(job, cfg)
        if "assets" in cfg.layout.folders and "assets" not in layout.folders:
            # A run whose files come to its own folder (transfer, S3) on a worker opened on a project still
            # reads that project's assets (assets/data/x.csv).
            layout = replace(layout, folders={**layout.folders, "assets": cfg.layout.folder("assets")})
        # A shared folder that is a project brings its own custom nodes; else they are this machine's.
        custom = layout.folder("custom_nodes") if (layout.data_dir / MANIFEST).is_file() else cfg.custom_nodes_dir
        # The bucket credentials stay here, in memory: the run's process never sees them.
        return replace(job, layout=layout.to_json(), s3_credentials=None,
                       custom_nodes_dir=job.custom_nodes_dir or str(custom),
                       plugins_dir=job.plugins_dir or str(cfg.plugins_dir),
                       plugin_store=job.plugin_store or str(cfg.plugin_store))

    def _same_machine(self, same: Layout) -> None:
        """The job came with the control plane's own layout (this machine is the control plane's)."""

    def _layout(self, job: Job, cfg: Config) -> Layout:
        """The run's folders on this machine, for a job from another machine's control plane: by
        default the agent's own installation's (a run that uses no files); the kinds that bring
        the files elsewhere say where."""
        return cfg.layout

    async def fetch_inputs(self) -> bool:
        return True

    def start(self) -> None:
        pass

    async def on_artifact(self, data: dict[str, Any]) -> dict[str, Any]:
        return data

    async def finish(self, final: dict[str, Any], handle: StopCount) -> dict[str, Any]:
        return final

    def new_credentials(self, raw: dict[str, Any]) -> None:
        pass


class OwnInstallFiles(Files):
    """A run that uses no files: the agent's own installation's folders, as they are (the default
    of every step)."""


class MountFiles(Files):
    """A ``data`` folder shared with the control plane: nothing moves, artifacts are named relative to it."""

    kind = "mount"

    def __init__(self, run_id: str, label: str, mounts: dict[str, str]) -> None:
        super().__init__(run_id)
        self.label = label
        self.mounts = mounts

    def _same_machine(self, same: Layout) -> None:
        # its data folder is the mount, so its artifacts (a checkpoint) get mount rows
        self.data_dir = same.data_dir

    def _layout(self, job: Job, cfg: Config) -> Layout:
        mount = self.mounts.get(self.label)
        if not mount:
            raise RuntimeError(f"the control plane placed a mount run here but no {self.label!r} mount is offered")
        self.data_dir = Path(mount)
        if (self.data_dir / MANIFEST).is_file():
            # The shared folder is a project (the control plane was started with --project on it): its
            # assets, graphs and custom nodes are the project's; uploads stay this installation's.
            return cfg.layout.with_project(self.data_dir)
        return Layout.for_data_dir(self.data_dir, read_roots=cfg.layout.read_roots)

    async def on_artifact(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.data_dir is None:
            return data
        path = Path(str(data.get("path", "")))
        rel = await asyncio.to_thread(inside_of, path, self.data_dir)
        if rel is None:
            return data  # not on the mount (a symlink out of it included): the control plane cannot read it there
        size, sha = await asyncio.to_thread(describe_if_there, path)
        return {**data, "backend": "mount", "label": self.label, "relative_path": str(rel), "size": size,
                "sha256": sha}
