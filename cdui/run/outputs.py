"""Recorded node outputs: captured in the run subprocess, kept on the machine that ran the run.

With ``options.record_outputs`` on, the run subprocess writes, after each node
that completes, a summary of every output (kind, shape, dtype, min/max/mean
over the finite values, a small PNG thumbnail for image-like tensors) and the
raw tensors up to :data:`RAW_MAX_BYTES` each into this machine's store:
the user data folder's ``outputs/`` (the agent's on a worker, the control
plane's for a local run). Nothing leaves the machine: the control plane asks a
worker for one summary at a time over its connection (:mod:`cdui.plane.http.api_outputs`).

Layout of the store (every name is ours, never a worker's or a user's)::

    outputs/<run id>/index.json         {"run_id", "nodes": [{"node_id", "type", "file"}], "dropped"}
    outputs/<run id>/<sha256(node id)>.json        the node's summary
    outputs/<run id>/<sha256(node id)>.<n>.pt      output n's raw tensor (torch.save)

Bounds: ``CODEFYUI_RUN_OUTPUT_STORE_MAX_MB`` for the whole store; the oldest
runs' captures (by the time their folder was made) are dropped first, then
this run stops keeping raw tensors, then it stops recording nodes (counted in
``dropped``). ``CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S`` is how long the run's
process waits, when the run ends however it ends (a stop included), for the
captures still being written; what is not written by then is left out. A
failure to record never fails the run: it is logged once as a warning.

The executor of each machine fills in where its store is and its limits
(:func:`for_this_machine`); the submitted options cannot name a folder.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import queue
import re
import shutil
import struct
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cdui.core.atomic import atomic_write
from cdui.core.units import size_text
from cdui.wire.node_outputs import (
    MAX_NODE_ID,
    MAX_NODES,
    MAX_NOTE,
    MAX_OUTPUTS,
    MAX_PREVIEW,
    MAX_SHAPE,
    MAX_THUMB_B64,
    PNG_MAGIC,
)

log = logging.getLogger(__name__)

# The job options only this machine's executor sets (never the submitter's).
OPT_DIR, OPT_MAX, OPT_TIMEOUT = "record_outputs_dir", "record_outputs_max_bytes", "record_outputs_write_timeout_s"
RAW_MAX_BYTES = 64 * 1024 * 1024   # a raw tensor larger than this keeps its summary only
THUMB_PX = 64                      # a thumbnail's longer side
MAX_SUMMARY_BYTES = 2 * 1024 * 1024  # one node's summary, encoded
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def store_dir(user_data: Path) -> Path:
    return Path(user_data) / "outputs"


def for_this_machine(job: Any, user_data: Path, cfg: Any) -> Any:
    """The job with this machine's store and limits when it records outputs (else without them)."""
    opts = {k: v for k, v in job.options.items() if k not in (OPT_DIR, OPT_MAX, OPT_TIMEOUT)}
    if job.options.get("record_outputs"):
        opts[OPT_DIR] = str(store_dir(user_data))
        opts[OPT_MAX] = int(cfg["CODEFYUI_RUN_OUTPUT_STORE_MAX_MB"]) * 1024 * 1024
        opts[OPT_TIMEOUT] = float(cfg["CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S"])
    return replace(job, options=opts)


def node_file(node_id: str) -> str:
    return hashlib.sha256(node_id.encode("utf-8", "surrogatepass")).hexdigest()


def run_folder(root: Path, run_id: str) -> Path | None:
    """The run's folder in the store, or None for a run id that cannot be one of ours."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        return None
    return Path(root) / run_id


# -- summaries -------------------------------------------------------------------------------------

def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def png(width: int, height: int, channels: int, pixels: bytes) -> bytes:
    """An 8-bit PNG of ``pixels`` (rows top to bottom, ``channels`` bytes per pixel: 1, 3 or 4)."""
    color = {1: 0, 3: 2, 4: 6}[channels]
    stride = width * channels
    raw = b"".join(b"\x00" + pixels[y * stride:(y + 1) * stride] for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    return (PNG_MAGIC + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _image_planes(t: Any) -> Any | None:
    """The (C, H, W) image of an image-like tensor: (C, H, W) or (N, C, H, W) with C in 1, 3, 4."""
    shape = tuple(t.shape)
    if len(shape) == 4 and shape[0] >= 1:
        t, shape = t[0], shape[1:]
    if len(shape) == 3 and shape[0] in (1, 3, 4) and shape[1] >= 4 and shape[2] >= 4:
        return t
    return None


def thumbnail(t: Any) -> str | None:
    """A base64 PNG of at most THUMB_PX on its longer side, scaled from the image's own min..max."""
    torch = sys.modules["torch"]
    img = _image_planes(t)
    if img is None or img.is_complex():
        return None
    c, h, w = (int(x) for x in img.shape)
    step = max(1, math.ceil(max(h, w) / THUMB_PX))
    img = img[:, ::step, ::step].to("cpu", torch.float32)
    img = torch.nan_to_num(img, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(img.min()), float(img.max())
    scaled = (img - lo) * (255.0 / (hi - lo)) if hi > lo else torch.zeros_like(img)
    pixels = scaled.clamp(0, 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    _, th, tw = (int(x) for x in img.shape)
    return base64.b64encode(png(tw, th, c, bytes(pixels.flatten().tolist()))).decode()


def preview(t: Any) -> list[list[float | None]] | None:
    """The values the Inspector shows: the top-left MAX_PREVIEW x MAX_PREVIEW block of the last two
    dimensions at index 0 of the others (a 1-D tensor is one row). Two tensors of one shape give
    blocks of the same elements, so the page can colour their difference. Not finite: None."""
    torch = sys.modules["torch"]
    if t.is_complex() or t.numel() == 0:
        return None
    while t.dim() > 2:
        t = t[0]
    block = t.reshape(1, 1) if t.dim() == 0 else t[:MAX_PREVIEW].reshape(1, -1) if t.dim() == 1 \
        else t[:MAX_PREVIEW, :MAX_PREVIEW]
    f = block.to("cpu", torch.float64)
    return [[v if math.isfinite(v) else None for v in row] for row in f.tolist()]


def summarize(port: str, value: Any) -> dict[str, Any]:
    """One output's summary: what the Inspector shows."""
    torch = sys.modules.get("torch")
    out: dict[str, Any] = {"port": str(port)[:128]}
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        out.update(kind="tensor", shape=[int(x) for x in t.shape][:MAX_SHAPE],
                   dtype=str(t.dtype).removeprefix("torch."))
        if t.numel() and not t.is_complex():
            f = t.to(torch.float64)
            finite = f[torch.isfinite(f)]
            if finite.numel():
                out.update(min=_finite(float(finite.min())), max=_finite(float(finite.max())),
                           mean=_finite(float(finite.mean())))
            if finite.numel() != f.numel():
                out["nonfinite"] = int(f.numel() - finite.numel())
        values = preview(t)
        if values is not None:
            out["preview"] = values
        thumb = thumbnail(t)
        if thumb is not None and len(thumb) <= MAX_THUMB_B64:
            out["thumbnail"] = thumb
        return out
    if torch is not None and isinstance(value, torch.nn.Module):
        out.update(kind="model", note=f"{type(value).__name__}, "
                                      f"{sum(p.numel() for p in value.parameters())} parameters")
        return out
    if isinstance(value, bool) or value is None:
        out.update(kind="value", note=repr(value))
    elif isinstance(value, (int, float)):
        out.update(kind="number", note=repr(value)[:MAX_NOTE])
        if math.isfinite(value):
            out.update(min=float(value), max=float(value), mean=float(value))
    elif isinstance(value, str):
        out.update(kind="text", note=value[:MAX_NOTE])
    elif isinstance(value, (list, tuple)):
        out.update(kind="list", note=f"{type(value).__name__} of {len(value)} items")
    else:
        out.update(kind="value", note=type(value).__name__)
    return out


# -- the recorder, in the run subprocess ----------------------------------------------------------

def _folder_bytes(folder: Path) -> int:
    total = 0
    for p in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


class Recorder:
    """Writes one run's captures from a writer thread, so nodes do not wait on the disk."""

    def __init__(self, root: Path, run_id: str, max_bytes: int, warn: Callable[[str], None]) -> None:
        folder = run_folder(root, run_id)
        if folder is None:
            raise ValueError(f"run id {run_id[:80]!r} cannot name a folder")
        self.root, self.folder, self.max_bytes, self.warn = Path(root), folder, max_bytes, warn
        self.root.mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(exist_ok=True)
        self.nodes: list[dict[str, Any]] = []
        self.dropped = 0
        self.own = 0
        self.others = self._others_bytes()
        self._warned = False
        self._queue: queue.Queue[tuple[str, str, dict[str, Any], list[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._write_loop, daemon=True, name="record-outputs")
        self._thread.start()
        self._write_index()

    def _others(self) -> list[Path]:
        """The other runs' folders, oldest first."""
        folders = []
        for p in self.root.iterdir():
            with contextlib.suppress(OSError):
                if p != self.folder and p.is_dir() and not p.is_symlink():
                    folders.append((p.stat().st_mtime, p.name, p))
        return [p for _, _, p in sorted(folders)]

    def _others_bytes(self) -> int:
        return sum(_folder_bytes(p) for p in self._others())

    def _room(self, size: int) -> bool:
        """Make room for ``size`` more bytes by dropping the oldest other runs; False when there is none."""
        if self.own + size > self.max_bytes:
            return False
        while self.others + self.own + size > self.max_bytes:
            others = self._others()
            if not others:
                self.others = 0
                break
            gone = _folder_bytes(others[0])
            shutil.rmtree(others[0], ignore_errors=True)
            self.others = max(0, self.others - gone)
        return True

    def node(self, node_id: str, node_type: str, result: dict[str, Any]) -> None:
        """Called by the executor after a node completed, with its outputs."""
        if len(self.nodes) + self._queue.qsize() >= MAX_NODES:
            self.dropped += 1
            return
        torch = sys.modules.get("torch")
        try:
            summaries = [summarize(k, v) for k, v in list(result.items())[:MAX_OUTPUTS]]
            raws: list[Any] = []
            for i, (_, v) in enumerate(list(result.items())[:MAX_OUTPUTS]):
                if torch is not None and isinstance(v, torch.Tensor) \
                        and v.numel() * v.element_size() <= RAW_MAX_BYTES:
                    # A copy: the next node may change the tensor in place while it waits to be written.
                    raws.append((i, v.detach().to("cpu", copy=True)))
        except Exception as exc:  # a value we cannot summarize must not fail the run
            self._warn(f"could not summarize the outputs of node {node_id!r}: {type(exc).__name__}: {exc}")
            return
        self._queue.put((node_id, node_type, {"node_id": node_id, "type": node_type,
                                              "outputs": summaries}, raws))

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self.warn(message)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._write(*item)
            except Exception as exc:  # a full disk or a folder dropped by another run: recording stops being exact
                self._warn(f"recording the outputs of node {item[0]!r} failed: {type(exc).__name__}: {exc}")

    def _write(self, node_id: str, node_type: str, summary: dict[str, Any], raws: list[Any]) -> None:
        name = node_file(node_id)
        text = json.dumps(summary, allow_nan=False)
        if len(text) > MAX_SUMMARY_BYTES or not self._room(len(text)):
            self.dropped += 1
            self._write_index()
            return
        atomic_write(self.folder / f"{name}.json", text)
        self.own += len(text)
        torch = sys.modules.get("torch")
        kept = []
        for i, t in raws:
            size = t.numel() * t.element_size() + 1024
            if torch is None or not self._room(size):
                continue
            path = self.folder / f"{name}.{i}.pt"
            torch.save(t, path)
            self.own += path.stat().st_size
            kept.append(i)
        self.nodes = [n for n in self.nodes if n["node_id"] != node_id]
        self.nodes.append({"node_id": node_id, "type": node_type, "file": name, "raw": kept})
        self._write_index()

    def _write_index(self) -> None:
        atomic_write(self.folder / "index.json",
                     json.dumps({"run_id": self.folder.name, "nodes": self.nodes, "dropped": self.dropped}))

    def close(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.warn(f"recorded outputs still being written after {timeout:g} s "
                      "(CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S) were left out")


@contextlib.contextmanager
def recording(job: Any, emit: Callable[[str, dict[str, Any]], None]) -> Iterator[
        Callable[[str, str, dict[str, Any]], None] | None]:
    """In the run subprocess: the executor's ``on_outputs`` while the run executes (None when not recording)."""
    opts = job.options
    if not opts.get("record_outputs") or not opts.get(OPT_DIR):
        yield None
        return

    def warn(message: str) -> None:
        emit("log", {"message": message, "level": "warning"})
    try:
        rec = Recorder(Path(opts[OPT_DIR]), job.run_id, int(opts.get(OPT_MAX) or 0), warn)
    except Exception as exc:  # e.g. a read-only user data folder: the run goes on without recording
        warn(f"node outputs are not recorded: {type(exc).__name__}: {exc}")
        yield None
        return
    try:
        yield rec.node
    finally:
        # Tell the launcher, so a stop waits for these writes (up to the timeout) rather
        # than killing the process at the stop grace.
        emit("outputs_writing", {})
        rec.close(float(opts.get(OPT_TIMEOUT) or 0.0))


# -- reading the store (the agent answering the control plane; the control plane for local runs) --

def _read_json(path: Path, limit: int) -> Any:
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"{path.name} is over {size_text(limit)}")
    return json.loads(raw)


def list_nodes(root: Path, run_id: str) -> list[dict[str, str]] | None:
    """The recorded nodes of a run (``[{node_id, type}]``), or None when this store has no capture of it."""
    folder = run_folder(root, run_id)
    if folder is None or not (folder / "index.json").is_file():
        return None
    index = _read_json(folder / "index.json", 8 * 1024 * 1024)
    # A node id too long for the wire cannot be asked for: leave it out rather than fail the list.
    return [{"node_id": str(n["node_id"]), "type": str(n["type"])[:128]} for n in index.get("nodes", [])[:MAX_NODES]
            if len(str(n["node_id"])) <= MAX_NODE_ID]


def read_node(root: Path, run_id: str, node_id: str) -> dict[str, Any] | None:
    """A recorded node's summary, or None when it has none here."""
    folder = run_folder(root, run_id)
    if folder is None:
        return None
    path = folder / f"{node_file(node_id)}.json"
    if not path.is_file():
        return None
    summary = _read_json(path, MAX_SUMMARY_BYTES)
    return summary if isinstance(summary, dict) and summary.get("node_id") == node_id else None


RAW_SERVE_MAX_BYTES = RAW_MAX_BYTES + 1024 * 1024  # a raw file as kept: the tensor and torch.save's wrapping


class RawNotKept(LookupError):
    """Why a recorded output has no raw tensor to download here (the message says it)."""


def find_raw(root: Path, run_id: str, node_id: str, port: str) -> Path:
    """The file of a recorded output's raw tensor in this machine's store.

    The path is built from our own names only (the run id checked, sha256 of the node id, the
    output's index in the summary), never taken from the index or a request. Raises RawNotKept."""
    folder = run_folder(root, run_id)
    summary = read_node(root, run_id, node_id) if folder is not None else None
    if folder is None or summary is None:
        raise RawNotKept(f"node {node_id!r} of run {run_id} has no recorded outputs here")
    ports = [str(o.get("port")) for o in summary.get("outputs", []) if isinstance(o, dict)]
    if port not in ports:
        raise RawNotKept(f"node {node_id!r} has no output {port!r}; its outputs are {', '.join(ports) or 'none'}")
    index = ports.index(port)
    kept: list[Any] = []
    with contextlib.suppress(OSError, ValueError):
        entry = next((n for n in _read_json(folder / "index.json", 8 * 1024 * 1024).get("nodes", [])
                      if isinstance(n, dict) and n.get("node_id") == node_id), None)
        kept = list(entry.get("raw") or []) if entry else []
    path = folder / f"{node_file(node_id)}.{index}.pt"
    if index not in kept or path.is_symlink() or not path.is_file():
        kind = next((o.get("kind") for o in summary["outputs"] if o.get("port") == port), "value")
        why = "it is not a tensor" if kind != "tensor" else (
            f"it was over {RAW_MAX_BYTES // (1024 * 1024)} MiB or the store's bound (CODEFYUI_RUN_OUTPUT_STORE_MAX_MB)")
        raise RawNotKept(f"output {port!r} of node {node_id!r} has no raw tensor kept: {why}")
    return path


class RawTooLarge(ValueError):
    """A kept raw file over RAW_SERVE_MAX_BYTES (the message says its size and the bound)."""

    def __init__(self, port: str, node_id: str, size: int) -> None:
        super().__init__(f"the raw tensor of output {port!r} of node {node_id!r} is {size_text(size)}, over the "
                         f"download bound of {size_text(RAW_SERVE_MAX_BYTES)}")
        self.size = size


class RawChunkOutOfRange(ValueError):
    """A chunk past the file's end was asked for."""


@dataclass(frozen=True)
class RawChunk:
    size: int  # of the whole file
    sha256: str  # of the whole file, for chunk 0 only ("" otherwise)
    data: bytes


def read_raw_chunk(root: Path, run_id: str, node_id: str, port: str, chunk: int, chunk_bytes: int) -> RawChunk:
    """Chunk ``chunk`` of a recorded output's raw tensor file in this machine's store (a worker
    answering the control plane's ``raw_request``). The file is found by :func:`find_raw` from our own
    names, opened without following a link, and refused whole when it is over the download bound.
    Raises RawNotKept, RawTooLarge, RawChunkOutOfRange or OSError."""
    path = find_raw(root, run_id, node_id, port)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > RAW_SERVE_MAX_BYTES:
            raise RawTooLarge(port, node_id, size)
        chunks = max(1, -(-size // chunk_bytes))
        if not 0 <= chunk < chunks:
            raise RawChunkOutOfRange(f"chunk {chunk} is past the end of a {size}-byte file ({chunks} chunks)")
        digest = ""
        if chunk == 0:
            h = hashlib.sha256()
            while block := f.read(1 << 20):
                h.update(block)
            digest = h.hexdigest()
        f.seek(chunk * chunk_bytes)
        return RawChunk(size, digest, f.read(chunk_bytes))


def forget_run(root: Path, run_id: str) -> None:
    """Drop a run's captures (the run was deleted)."""
    folder = run_folder(root, run_id)
    if folder is not None and folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
