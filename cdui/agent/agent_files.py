"""Files of runs on a worker: the ``data`` mount, and the transfer backend's agent side.

For each assigned run the agent picks the run's data folder from the job's
``files.backend``:

- ``None`` (the run uses no files): the agent's own installation layout;
- ``mount``: the folder the agent declared with ``--mount data=PATH``;
  artifacts are reported relative to it (``backend: "mount"``);
- ``transfer``: ``<user-data>/agent-runs/<run id>/data``. Inputs are fetched by
  sha256 into ``<user-data>/agent-cache/<sha256>`` (kept; deleting it is safe)
  and copied under the names the graph uses. What the run
  records is uploaded while it runs; what it wrote under ``models/ media/
  output/`` (and inputs it overwrote) after it ends; the interrupt checkpoint
  last. The run's end is reported only after that.

Unreachable control plane (connection errors, 502/503/504): retry with growing
backoff for up to the resume grace, shared by the run's files, then one last
try each. Files the control plane refuses stay on the worker,
listed with their worker path and a ``transfer_failed`` warning (docs/remote-workers.md#the-transfer-backend).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from cdui.agent.s3_agent import S3RunFiles
from cdui.core.atomic import replacing
from cdui.core.backoff import backoff_delays
from cdui.core.errors import human_size
from cdui.core.layout import Layout
from cdui.core.paths import safe_join, sha256_file
from cdui.nodes.offline_datasets import DATASETS_FOLDER
from cdui.wire.job import Job, JobFiles
from cdui.wire.s3 import S3Credentials

log = logging.getLogger("cdui.agent.agent")
RETRY_STATUSES = {502, 503, 504}
OUTPUT_FOLDERS = ("models", "media", "output")
# why a file stayed on the worker when a Stop came during the final uploads (it already has its warning)
STOPPED_DURING_FINAL = "stopped during the final uploads"


class Unreachable(Exception):
    """The control plane could not be reached (worth retrying)."""


class Refused(Exception):
    """The control plane answered no (not worth retrying)."""


class _Stopped(Exception):
    """The run was stopped while one of its inputs was downloading."""




def describe(path: Path) -> tuple[int, str | None]:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()), None
    return sha256_file(path)


class RunFiles:
    """The file side of one run on this agent."""

    def __init__(self, run_id: str, files: JobFiles, user_data: Path, mounts: dict[str, str],
                 session: aiohttp.ClientSession | None, control: str, credential: str,
                 grace_s: float, record: Callable[[str, dict[str, Any]], None],
                 stop_event: asyncio.Event) -> None:
        self.run_id = run_id
        self.backend: str | None = files.backend
        self.label: str = files.label or "data"
        self.inputs: list[dict[str, Any]] = list(files.inputs)
        self.user_data = user_data
        self.mounts = mounts
        self.session = session
        self.control = control.rstrip("/")
        self.credential = credential
        self.grace_s = grace_s
        self.record = record
        self.stop_event = stop_event
        self.data_dir: Path | None = None
        self.input_shas: dict[str, str] = {}  # relative path -> sha256 as given
        self.uploaded: set[Path] = set()
        self._queue: asyncio.Queue[tuple[Path, dict[str, Any]] | None] = asyncio.Queue()
        self._held_last: list[tuple[Path, dict[str, Any]]] = []
        self._left: list[tuple[Path, dict[str, Any], str]] = []
        self._uploader: asyncio.Task[Any] | None = None
        self._retry_deadline: float | None = None
        self.s3: Any = None  # an s3 run's bucket access (cdui.agent.s3_agent.S3RunFiles), with its credentials

    # -- before the run ----------------------------------------------------------
    def job_for_this_machine(self, job: Job, cfg: Any) -> Job:
        """The job with this machine's layout (and custom nodes), per backend (``cfg``: the agent's config)."""
        # Absolute paths are read under this agent's own read roots, whoever sent the layout.
        roots = cfg.layout.read_roots
        if job.layout is not None:
            # an agent on the control plane's own machine: its folders are the control plane's
            same = Layout.from_json(job.layout)
            if self.backend == "mount":
                # its data folder is the mount, so its artifacts (a checkpoint) get mount rows
                self.data_dir = same.data_dir
            return replace(job, layout=replace(same, read_roots=roots).to_json(), s3_credentials=None)
        if self.backend == "mount":
            mount = self.mounts.get(self.label)
            if not mount:
                raise RuntimeError(f"the control plane placed a mount run here but no {self.label!r} mount is offered")
            self.data_dir = Path(mount)
            layout = Layout.for_data_dir(self.data_dir, read_roots=roots)
        elif self.backend in ("transfer", "s3"):
            self.data_dir = self.user_data / "agent-runs" / self.run_id / "data"
            layout = Layout.for_data_dir(self.data_dir, read_roots=roots)
            layout.ensure()
            # Datasets are not sent with a run: the Dataset node reads this machine's own data folder.
            layout.folders[DATASETS_FOLDER] = cfg.layout.data_dir
            if self.backend == "s3":
                self._s3_from(job)
        else:
            layout = cfg.layout
        # The bucket credentials stay here, in memory: the run's process never sees them.
        return replace(job, layout=layout.to_json(), s3_credentials=None,
                       custom_nodes_dir=job.custom_nodes_dir or str(cfg.custom_nodes_dir),
                       plugins_dir=job.plugins_dir or str(cfg.plugins_dir))

    def _s3_from(self, job: Job) -> None:
        if job.files.s3 is None or job.s3_credentials is None:
            raise RuntimeError("the control plane sent an s3 run without its bucket or credentials")
        self.s3 = S3RunFiles(self.run_id, job.files.s3, S3Credentials.from_dict(job.s3_credentials),
                             self.stop_event, max(self.grace_s, 60.0), Unreachable, Refused)

    def new_credentials(self, raw: dict[str, Any]) -> None:
        """Fresh bucket credentials from the control plane (renewal, reconnect)."""
        if self.s3 is not None:
            self.s3.new_credentials(raw)

    async def fetch_inputs(self) -> bool:
        """Fetch every input (cache first). Returns False if the run was stopped meanwhile."""
        if self.backend not in ("transfer", "s3") or not self.inputs:
            return True
        assert self.data_dir is not None
        cache = self.user_data / "agent-cache"
        cache.mkdir(parents=True, exist_ok=True)
        n = len(self.inputs)
        log.info("run %s: fetching %d input(s)", self.run_id, n)
        for i, inp in enumerate(self.inputs, 1):
            if self.stop_event.is_set():
                return False
            sha, folder, name = inp["sha256"], inp["folder"], inp["name"]
            cached = cache / sha
            how = "cached"
            if not (cached.is_file() and cached.stat().st_size == inp.get("size", cached.stat().st_size)):
                how = "fetched"
                if self.s3 is not None:
                    await self._s3_download(sha, cached)
                elif not await self._download(folder, name, sha, cached):
                    return False
            dest = safe_join(self.data_dir / folder, name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            # A copy, never a link: a node that overwrites its input cannot alter the cache.
            await asyncio.to_thread(shutil.copyfile, cached, dest)
            self.input_shas[f"{folder}/{name}"] = sha
            self.record("run_warning", {"kind": "transfer_progress", "file": name, "how": how,
                                        "message": f"fetching inputs {i}/{n}: {Path(name).name} "
                                                   f"({human_size(inp.get('size', 0))}, {how})"})
        return True

    async def _s3_download(self, sha: str, dest: Path) -> None:
        """From the bucket, with the same retries through outages as the transfer backend's."""
        delays = _delays()
        deadline = time.monotonic() + self.grace_s
        while True:
            try:
                await self.s3.download_input(sha, dest)
                return
            except Unreachable as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not download input {sha[:12]} from the bucket: {exc}") from None
                log.warning("run %s: downloading input %s failed (%s); retrying", self.run_id, sha[:12], exc)
                await asyncio.sleep(next(delays))
            except Refused as exc:
                raise RuntimeError(str(exc)) from None

    async def _download(self, folder: str, name: str, sha: str, dest: Path) -> bool:
        """Download one input into ``dest`` (whole and checked, or not at all); False if the run was stopped."""
        url = f"{self.control}/api/{folder}/download/{name}"
        delays = _delays()
        deadline = time.monotonic() + self.grace_s
        while True:
            try:
                # The cache entry is named by its sha256: it appears only complete and checked.
                with replacing(dest) as tmp:
                    got = await self._stream_into(url, folder, name, tmp)
                    if got is None:
                        raise _Stopped
                    if got != sha:
                        raise RuntimeError(f"{folder}/{name} arrived with sha256 {got}, expected {sha}: "
                                           f"the file changed on the control plane since the run was queued")
                return True
            except _Stopped:
                return False
            except (TimeoutError, aiohttp.ClientError, OSError, Unreachable) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not download {folder}/{name}: {exc}") from None
                log.warning("run %s: downloading %s/%s failed (%s); retrying", self.run_id, folder, name, exc)
                try:
                    await asyncio.wait_for(self.stop_event.wait(), next(delays))
                    return False
                except TimeoutError:
                    pass

    async def _stream_into(self, url: str, folder: str, name: str, tmp: Path) -> str | None:
        """Write the answer's body to ``tmp``; its sha256, or None if the run was stopped meanwhile."""
        assert self.session is not None
        h = hashlib.sha256()
        async with self.session.get(url, headers={"Authorization": f"Bearer {self.credential}"}) as resp:
            if resp.status in RETRY_STATUSES:
                raise Unreachable(f"HTTP {resp.status}")
            if resp.status != 200:
                raise RuntimeError(f"downloading {folder}/{name} was refused: HTTP {resp.status} "
                                   f"{(await resp.text())[:300]}")
            with open(tmp, "wb") as fh:
                async for chunk in resp.content.iter_chunked(1 << 20):
                    if self.stop_event.is_set():
                        return None
                    h.update(chunk)
                    fh.write(chunk)
        return h.hexdigest()

    # -- during the run ----------------------------------------------------------
    def start(self) -> None:
        if self.backend in ("transfer", "s3"):
            self._uploader = asyncio.create_task(self._upload_loop())

    async def on_artifact(self, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrite (and, for transfer runs, schedule) one artifact event of the run."""
        path = Path(str(data.get("path", "")))
        if self.backend == "mount" and self.data_dir is not None:
            try:
                rel = str(path.resolve().relative_to(self.data_dir.resolve()))
            except ValueError:
                return data
            size, sha = await asyncio.to_thread(describe, path) if path.exists() else (None, None)
            return {**data, "backend": "mount", "label": self.label, "relative_path": rel, "size": size, "sha256": sha}
        if self.backend not in ("transfer", "s3") or self.data_dir is None:
            return data
        # The row comes with the upload (here: its own s3 event once the object is in the bucket).
        out = {**data, "backend": self.backend, **({"upload": "queued"} if self.backend == "s3" else {})}
        try:
            inside = path.resolve().relative_to(self.data_dir.resolve())
        except ValueError:
            return out
        if inside.parts and inside.parts[0] in OUTPUT_FOLDERS:
            return out  # uploaded after the run, to the same relative path (second group)
        kind = str(data.get("kind") or "output")
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            name = f.name if f == path else f"{path.name}/{f.relative_to(path)}"
            item = (f, {"group": "artifact", "kind": kind, "name": name})
            if f.name == "interrupt.pt":
                self._held_last.append(item)  # third group: after everything else
            else:
                self._queue.put_nowait(item)
        return out

    async def _upload_loop(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            await self._upload_or_leave(*item)

    async def _upload_or_leave(self, path: Path, meta: dict[str, Any]) -> None:
        if path in self.uploaded:
            return
        try:
            await self._upload_with_retry(path, meta)
            self.uploaded.add(path)
        except (Refused, Unreachable, OSError) as exc:
            self._left.append((path, meta, str(exc)))

    async def _upload_with_retry(self, path: Path, meta: dict[str, Any]) -> None:
        delays = _delays()
        last_try = False
        while True:
            try:
                await self._upload(path, meta)
                return
            except Unreachable as exc:
                now = time.monotonic()
                if self._retry_deadline is None:
                    self._retry_deadline = now + self.grace_s  # one budget for all of the run's files
                if last_try:
                    raise
                if now >= self._retry_deadline:
                    last_try = True  # the budget is spent: one more try, then it stays here
                    continue
                delay = min(next(delays), max(0.1, self._retry_deadline - now))
                log.warning("run %s: uploading %s failed (%s); retrying in %.1f s", self.run_id, path.name, exc, delay)
                await asyncio.sleep(delay)

    async def _upload(self, path: Path, meta: dict[str, Any]) -> None:
        if self.s3 is not None:
            await self.s3.upload(path, meta, await self._sha(path), self.record)
            return
        assert self.session is not None
        sha = (await asyncio.to_thread(sha256_file, path))[1]
        form = aiohttp.FormData()
        form.add_field("meta", json.dumps({**meta, "sha256": sha, "size": path.stat().st_size}),
                       content_type="application/json")
        with open(path, "rb") as fh:
            form.add_field("file", fh, filename=path.name, content_type="application/octet-stream")
            try:
                async with self.session.post(f"{self.control}/api/runs/{self.run_id}/artifacts/upload", data=form,
                                             headers={"Authorization": f"Bearer {self.credential}"}) as resp:
                    if resp.status in RETRY_STATUSES:
                        raise Unreachable(f"HTTP {resp.status}")
                    if resp.status >= 300:
                        try:
                            msg = (await resp.json())["error"]["message"]
                        except Exception:
                            msg = f"HTTP {resp.status}"
                        raise Refused(msg)
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
                raise Unreachable(str(exc) or type(exc).__name__) from None

    # -- after the run -------------------------------------------------------------
    @staticmethod
    async def _sha(path: Path) -> str:
        return (await asyncio.to_thread(sha256_file, path))[1]

    async def finish(self, final: dict[str, Any], handle: Any) -> dict[str, Any]:
        """The second and third groups, then what stays on the worker. Runs before the end is reported.

        A Stop that ended the run came before this and does not count; a Stop pressed
        during these uploads leaves the rest on the worker."""
        if self.backend not in ("transfer", "s3") or self.data_dir is None:
            return final
        stops_before = handle.stop_count
        self._queue.put_nowait(None)
        if self._uploader is not None:
            await self._uploader
        outputs = await self._changed_outputs(self.data_dir)
        await self._upload_final(outputs + self._held_last, lambda: handle.stop_count > stops_before)
        self._record_left(self.data_dir)
        return final

    async def _changed_outputs(self, data_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
        """Files the run wrote: everything new in the output folders, and inputs it overwrote."""
        outputs: list[tuple[Path, dict[str, Any]]] = []
        for folder in OUTPUT_FOLDERS:
            root = data_dir / folder
            if root.is_dir():
                for p in sorted(root.rglob("*")):
                    if p.is_file() and not p.is_symlink() and not p.name.startswith(".upload-"):
                        rel = str(p.relative_to(data_dir))
                        if rel in self.input_shas and await self._sha(p) == self.input_shas[rel]:
                            continue  # an input, unchanged
                        outputs.append((p, {"group": "output", "relative_path": rel}))
        for rel, sha in self.input_shas.items():  # overwritten inputs outside models/ media/ output/
            p = data_dir / rel
            if rel.split("/")[0] not in OUTPUT_FOLDERS and p.is_file() and await self._sha(p) != sha:
                outputs.append((p, {"group": "artifact", "kind": "output", "name": f"inputs/{rel}"}))
        return outputs

    async def _upload_final(self, pending: list[tuple[Path, dict[str, Any]]],
                            stopped: Callable[[], bool]) -> None:
        """Upload ``pending`` in order; once a Stop arrives, the rest stays on the worker."""
        for i, (path, meta) in enumerate(pending):
            if stopped():
                rest = pending[i:]
                for p, m in rest:
                    self._left.append((p, m, STOPPED_DURING_FINAL))
                self.record("run_warning", {"kind": "transfer_failed", "count": len(rest),
                                            "message": f"{len(rest)} file(s) were not uploaded because the run was "
                                                       f"stopped; they stay on the worker under {self.data_dir}"})
                break
            await self._upload_or_leave(path, meta)

    def _record_left(self, data_dir: Path) -> None:
        """An artifact event for each file left on the worker, and a warning saying why (a Stop already had one)."""
        for path, meta, why in self._left:
            size = path.stat().st_size if path.exists() else None
            inside = path.is_relative_to(data_dir)
            self.record("artifact", {"kind": meta.get("kind", "output"), "name": path.name, "path": str(path),
                                     "relative_path": str(path.relative_to(data_dir)) if inside else None,
                                     "backend": "left_on_worker", "size": size})
            if why != STOPPED_DURING_FINAL:
                self.record("run_warning", {"kind": "transfer_failed", "file": str(path),
                                            "message": f"{path.name} stays on the worker at {path}: {why}"})


def _delays(start: float = 1.0, cap: float = 60.0):
    return backoff_delays(start, cap)
