"""One interface for where a run's files live on the machine that runs it.

A job's ``files.backend`` names the kind (:data:`cdui.wire.job.BACKENDS`); the
agent builds one object of that kind per run (``cdui.agent.run_files.run_files``)
and then only ever calls the operations below, in this order:

1. :meth:`FileBackend.job_for_this_machine`: the job with this machine's folders
   (the run's data folder, custom nodes, plugins) and without the bucket
   credentials, which stay in the backend's memory;
2. :meth:`FileBackend.fetch_inputs`: every input of the job into the run's data
   folder, byte-identical to what the control plane holds (False: the run was
   stopped meanwhile);
3. :meth:`FileBackend.start` when the run process starts;
4. :meth:`FileBackend.on_artifact` for each artifact event the run records: the
   event as the control plane must see it (a mount row relative to the mount, a
   file queued for upload);
5. :meth:`FileBackend.finish` before the run's end is reported: what the run
   wrote is where the control plane can read it, or stays on the worker with
   an event that says so.

:meth:`FileBackend.new_credentials` may come at any time (the control plane
renews a bucket's temporary credentials).

Invariants every kind keeps (tests/test_file_backends.py checks each):
nothing outside the run's data folder is uploaded or described (an absolute
path, ``..`` or a symlink out of it is not the run's), every moved file is
checked by its sha256, and an input that does not arrive whole leaves no
partial file behind. The kinds are the run's own installation (no files
used), a ``data`` mount shared with the control plane, the transfer backend
(the control plane's HTTP routes) and the S3 backend (a bucket).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from cdui.core.config import Config
from cdui.wire.job import Job

# Where a run writes its outputs: files new or changed there after the run are its outputs.
OUTPUT_FOLDERS = ("models", "media", "output")


class StopCount(Protocol):
    """How often Stop was pressed for the run (cdui.run.runner.RunHandle has it)."""

    @property
    def stop_count(self) -> int: ...


class FileBackend(Protocol):
    """The file side of one run on a worker; one class per ``files.backend`` kind."""

    @property
    def kind(self) -> str | None:
        """The job's files.backend: None (the machine's own installation), "mount", "transfer" or "s3"."""
        ...

    # The run's data folder on this machine once the job was prepared; None: the installation's own.
    data_dir: Path | None

    def job_for_this_machine(self, job: Job, cfg: Config) -> Job:
        """The job with this machine's layout (``cfg``: the agent's config) and no bucket credentials."""
        ...

    async def fetch_inputs(self) -> bool:
        """Every input into the run's data folder; False if the run was stopped meanwhile."""
        ...

    def start(self) -> None:
        """The run process starts: uploads made while it runs may begin."""
        ...

    async def on_artifact(self, data: dict[str, Any]) -> dict[str, Any]:
        """One artifact event of the run as the control plane must see it."""
        ...

    async def finish(self, final: dict[str, Any], handle: StopCount) -> dict[str, Any]:
        """The run's outputs where the control plane reads them (or left here, said so); returns ``final``.

        A Stop pressed during this (``handle.stop_count`` grows) leaves the rest on the worker."""
        ...

    def new_credentials(self, raw: dict[str, Any]) -> None:
        """Fresh bucket credentials from the control plane (the other kinds have none)."""
        ...
