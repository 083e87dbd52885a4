"""The transfer backend, control-plane side: the control plane as a run's file store.

A worker without the ``data`` mount downloads the run's inputs from the
ordinary download routes (with its worker credential, only that run's
inputs) and uploads what the run wrote to ``POST /api/runs/{id}/artifacts/upload``:

- group ``artifact`` (checkpoints, TensorBoard files, models the run records):
  into the run's own folder ``<data>/runs/<run id>/<kind>/<name>``;
- group ``output`` (files written under ``models/``, ``media/``, ``output/``):
  to the same relative path in this server's folders. An existing different
  file is kept and the new one gets a suffix (``best-1.pt``); identical content
  is stored once.

Every stored file's bytes are also kept under their sha256 (:class:`cdui.plane.files.artifact_files.KeptFiles`,
a hard link), so the row stays true when something else later replaces the file at its path.

Uploads stream to disk while hashing (constant memory), are refused past
``CODEFYUI_MAX_UPLOAD_SIZE`` per file and past ``CODEFYUI_RUN_UPLOAD_QUOTA`` for
all of a run's uploads together (counted from its stored transfer artifacts, so
a file stored once already for another name counts again: the bound is on what
a worker may send), and never land outside those folders: names go
through :func:`cdui.core.paths.safe_join`, and every refusal is logged.
The agent side lives in :mod:`cdui.agent.transfer_agent`.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from cdui.core.errors import CduiError, PathRefused
from cdui.core.layout import Layout
from cdui.core.paths import safe_join, sha256_file
from cdui.core.units import size_text
from cdui.plane.appkeys import CONFIG
from cdui.plane.files.receive import receive, refuse_temporary_name
from cdui.plane.runs import RUNS
from cdui.plane.store import ACTIVE
from cdui.wire.protocol import loads

log = logging.getLogger(__name__)
ARTIFACT_KINDS = {"checkpoint", "tensorboard", "model", "output", "log", "metrics"}
OUTPUT_FOLDERS = ("models", "media", "output")


def artifact_target(layout: Layout, run_id: str, kind: str, name: str) -> Path:
    if kind not in ARTIFACT_KINDS:
        raise CduiError("bad_upload", f"artifact kind {kind!r} is not accepted",
                        hint=f"use one of {sorted(ARTIFACT_KINDS)}", status=400)
    refuse_temporary_name(name)
    return safe_join(layout.run_dir(run_id), f"{kind}/{name}")


def output_target(layout: Layout, relative_path: str) -> Path:
    rel = relative_path.replace("\\", "/")
    head, _, rest = rel.partition("/")
    if head not in OUTPUT_FOLDERS or not rest:
        raise PathRefused(relative_path, f"workers may write only into {', '.join(f + '/' for f in OUTPUT_FOLDERS)}")
    refuse_temporary_name(rest)
    return safe_join(layout.folder(head), rest)




def free_name(target: Path, sha: str) -> tuple[Path, bool]:
    """Where a file with content ``sha`` goes when ``target`` may exist: an existing different
    file is kept, never overwritten.

    Returns (path, already_there): an identical file is reused; a different
    one is kept and the new file gets the first free ``-N`` suffix."""
    if not target.exists():
        return target, False
    if target.is_file() and sha256_file(target)[1] == sha:
        return target, True
    i = 1
    while True:
        cand = target.with_name(f"{target.stem}-{i}{target.suffix}")
        if not cand.exists():
            return cand, False
        if cand.is_file() and sha256_file(cand)[1] == sha:
            return cand, True
        i += 1


META_LIMIT = 16 * 1024  # the JSON part that describes an upload; the file part streams


async def _read_meta(part: Any) -> Any:
    raw = bytearray()
    while chunk := await part.read_chunk(8192):
        raw += chunk
        if len(raw) > META_LIMIT:
            raise CduiError("too_large", f"the upload's meta part is over {size_text(META_LIMIT)}",
                            hint="meta is a small JSON object; the file goes in the 'file' part", status=413)
    return loads(bytes(raw))


async def upload_handler(request: web.Request) -> web.Response:
    service = request.app[RUNS]
    cfg = request.app[CONFIG]
    run_id = request.match_info["run_id"]
    worker = request.get("worker")
    if request.get("auth") != "worker" or not worker:
        raise CduiError("forbidden", "artifact uploads come from workers, with their worker credential",
                        hint="send Authorization: Bearer <worker credential>", status=403)
    run = await service.store.get_run(run_id)
    if run is None or run.worker_id != worker:
        log.warning("worker %s tried to upload into run %s, which is not its run", worker, run_id)
        raise CduiError("forbidden", f"run {run_id} is not a run of worker {worker}", status=403)
    if run.status not in ACTIVE:
        raise CduiError("run_ended", f"run {run_id} is {run.status}; its files are no longer accepted",
                        hint="the file stays on the worker", status=409)
    limit = cfg["CODEFYUI_MAX_UPLOAD_SIZE"]
    try:
        reader = await request.multipart()
        meta_part = await reader.next()
        is_meta = isinstance(meta_part, BodyPartReader) and meta_part.name == "meta"
        meta = await _read_meta(meta_part) if is_meta else None
        if not isinstance(meta, dict):
            raise ValueError("the first part must be 'meta' (JSON)")
        file_part = await reader.next()
        if not isinstance(file_part, BodyPartReader) or file_part.name != "file":
            raise ValueError("the second part must be 'file'")
    except (ValueError, AssertionError, KeyError) as exc:
        raise CduiError("bad_upload", f"malformed artifact upload: {exc}") from None
    group = meta.get("group")
    try:
        if group == "artifact":
            kind = str(meta.get("kind") or "output")
            target = artifact_target(cfg.layout, run_id, kind, str(meta.get("name") or ""))
        elif group == "output":
            kind = "output"
            target = output_target(cfg.layout, str(meta.get("relative_path") or ""))
        else:
            raise CduiError("bad_upload", f"upload group {group!r} is not 'artifact' or 'output'")
    except CduiError as err:
        log.warning("refused upload from worker %s for run %s: %s", worker, run_id, err.message)
        raise
    # The run's quota: what its uploads stored so far, and what this file may still add.
    quota = cfg["CODEFYUI_RUN_UPLOAD_QUOTA"]
    used = sum(int(a.get("size") or 0) for a in await service.store.artifacts(run_id) if a.get("backend") == "transfer")
    raw_size = meta.get("size")
    announced = raw_size if isinstance(raw_size, int) and not isinstance(raw_size, bool) and raw_size > 0 else 0

    def over_quota(size: int) -> CduiError:
        log.warning("refused upload %s from worker %s for run %s: over the run's upload quota (%d + %d > %d bytes)",
                    target.name, worker, run_id, used, size, quota)
        return CduiError("upload_quota", f"{target.name} (at least {size_text(size)}) would take run {run_id}'s "
                         f"uploads to {size_text(used + size)} or more, over its quota of {size_text(quota)} "
                         f"(CODEFYUI_RUN_UPLOAD_QUOTA); {size_text(used)} are stored already",
                         hint="it stays on the worker; raise CODEFYUI_RUN_UPLOAD_QUOTA on the control plane "
                              "(0: no quota), or write fewer or smaller files", status=413)
    if quota and used + announced > quota:
        raise over_quota(announced)

    def too_large(size: int) -> CduiError:
        if quota and used + size > quota and quota - used < limit:
            return over_quota(size)
        return CduiError("too_large", f"{target.name} is over the upload limit of {size_text(limit)} "
                                      f"(CODEFYUI_MAX_UPLOAD_SIZE)", hint="it stays on the worker", status=413)
    cap = min(limit, max(quota - used, 0)) if quota else limit
    got = await receive(file_part, target.parent, cap, too_large)
    try:
        digest, size = got.sha256, got.size
        service.counts.transfer_bytes.inc(size)
        if meta.get("sha256") and meta["sha256"] != digest:
            raise CduiError("bad_upload", f"{target.name} arrived with sha256 {digest}, expected {meta['sha256']}",
                            hint="the agent retries the upload", status=400)
        final, existed = await asyncio.to_thread(free_name, target, digest)
        if not existed:
            got.commit(final)
    finally:
        got.discard()  # also the copy of a file stored once already
    try:
        rel = str(final.resolve().relative_to(cfg.layout.data_dir.resolve()))
    except ValueError:
        rel = str(final)
    existing = [a for a in await service.store.artifacts(run_id) if a["path"] == str(final) and a["sha256"] == digest]
    # The bytes are kept under their sha256 as well (cdui/plane/files/artifact_files.py): a later local run or
    # upload may replace the file at this path, and this row must still download these bytes.
    if existing:
        row = existing[0]
        await service.keep_received(final, digest, None)
    else:
        aid = await service.keep_received(final, digest, {
            "run_id": run_id, "kind": kind, "name": final.name, "backend": "transfer", "path": str(final),
            "relative_path": rel, "size": size, "sha256": digest})
        row = {"id": aid, "path": str(final)}
    return web.json_response({"id": row["id"], "path": str(final), "relative_path": rel, "size": size,
                              "sha256": digest, "stored_once": existed}, status=201)




async def worker_may_download(request: web.Request, folder: str, name: str) -> bool:
    """A worker credential downloads only inputs of its own active runs: a worker sees no other run's data."""
    service = request.app[RUNS]
    worker = request.get("worker")
    rows = await asyncio.to_thread(service.store.runs_in_status_sync, ACTIVE)
    for r in rows:
        if r.worker_id != worker:
            continue
        for inp in ((r.options or {}).get("files") or {}).get("inputs") or []:
            if inp.get("folder") == folder and inp.get("name") == name:
                return True
    return False


def setup(app: web.Application) -> None:
    app.router.add_post("/api/runs/{run_id}/artifacts/upload", upload_handler)

