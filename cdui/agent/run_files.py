"""The one place that picks a run's file backend by its kind; everything after holds a FileBackend."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from cdui.agent.agent_files import MountFiles, OwnInstallFiles
from cdui.agent.s3_agent import S3Files
from cdui.agent.transfer_agent import TransferFiles
from cdui.wire.file_backend import FileBackend
from cdui.wire.job import JobFiles


def run_files(run_id: str, files: JobFiles, user_data: Path, mounts: dict[str, str],
              session: aiohttp.ClientSession | None, control: str, credential: str,
              grace_s: float, record: Callable[[str, dict[str, Any]], None],
              stop_event: asyncio.Event) -> FileBackend:
    """The file backend of one run, of the kind its job names (``files.backend``)."""
    if files.backend == "mount":
        return MountFiles(run_id, files.label or "data", mounts)
    if files.backend in ("transfer", "s3"):
        kind = S3Files if files.backend == "s3" else TransferFiles
        return kind(run_id, files.inputs, user_data, session, control, credential, grace_s, record, stop_event)
    return OwnInstallFiles(run_id)
