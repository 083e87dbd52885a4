"""The transfer backend, agent side: a run folder of its own, inputs from the control plane, outputs back to it.

The run's data folder is ``<user-data>/agent-runs/<run id>/data``. Inputs are
fetched by sha256 into ``<user-data>/agent-cache/<sha256>`` (kept; deleting it
is safe) and copied under the names the graph uses. What the run records is
uploaded while it runs; what it wrote under ``models/ media/ output/`` (and
inputs it overwrote) after it ends; the interrupt checkpoint last. The run's
end is reported only after that. :class:`cdui.agent.s3_agent.S3Files` keeps
all of this and moves the bytes through a bucket instead.

Unreachable control plane (connection errors, 502/503/504): retry with growing
backoff for up to the resume grace, shared by the run's files, then one last
try each. Files the control plane refuses stay on the worker,
listed with their worker path and a ``transfer_failed`` warning (docs/remote-workers.md#the-transfer-backend).
The control plane's side is :mod:`cdui.plane.files.transfer`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import select
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter
from aiohttp.payload import BufferedReaderPayload

from cdui.agent.agent_files import Files, Refused, Unreachable, files_of, inside_of
from cdui.core.atomic import replacing
from cdui.core.backoff import backoff_delays
from cdui.core.config import Config
from cdui.core.errors import human_size
from cdui.core.hashed_write import HashedWriter
from cdui.core.layout import Layout
from cdui.core.paths import safe_join, sha256_file
from cdui.core.units import size_text
from cdui.nodes.offline_datasets import DATASETS_FOLDER
from cdui.wire.file_backend import OUTPUT_FOLDERS, StopCount
from cdui.wire.job import Job

log = logging.getLogger("cdui.agent.agent")
RETRY_STATUSES = {502, 503, 504}
# why a file stayed on the worker when a Stop came during the final uploads (it already has its warning)
STOPPED_DURING_FINAL = "stopped during the final uploads"
# An input's cache entry is named by its sha256: nothing else may name a file there.
SHA256 = re.compile(r"[0-9a-f]{64}")


# The read buffer of a download: the network is read this far ahead of the thread that hashes and writes.
READ_BUFFER = 2 << 20
# An input this large reports how far its fetch has got while it runs (at each quarter, and at least every
# PROGRESS_EVERY_S seconds), not only one line once it is there: a 10 GiB dataset on a slow link is minutes.
PROGRESS_MIN_BYTES = 64 << 20
PROGRESS_EVERY_S = 10.0


def _size(inp: dict[str, Any]) -> int | None:
    """The input's size as the control plane gave it, if it gave one."""
    size = inp.get("size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


# The pieces an upload reads its file in, one read ahead of the socket (see ReadAheadFile).
SEND_PIECE = 1 << 20


class ReadAheadFile(BufferedReaderPayload):
    """A file sent as a form part, read in a thread one piece ahead of the socket.

    aiohttp's own file part reads 256 KiB in a thread, sends it, and only then reads the next: the
    disk and the network take turns, and an upload ran at 0.6-0.7 x curl's on the same route. Here the
    next piece is read while this one is sent; at most two pieces are held, whatever the file's size."""

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        left = content_length
        fh = self._value

        def first() -> bytes:
            self._set_or_restore_start_position()  # a retry sends the file from its start again
            return fh.read(SEND_PIECE if left is None else min(SEND_PIECE, left))

        ahead: asyncio.Future[bytes] | None = asyncio.ensure_future(asyncio.to_thread(first))
        try:
            while ahead is not None:
                piece = await ahead
                ahead = None
                if not piece:
                    return
                if left is not None:
                    piece = piece[:left]
                    left -= len(piece)
                if left is None or left > 0:
                    ahead = asyncio.ensure_future(asyncio.to_thread(
                        fh.read, SEND_PIECE if left is None else min(SEND_PIECE, left)))
                await writer.write(piece)
        finally:
            if ahead is not None:
                # Cancelled or failed while a read is in its thread: it ends before the caller closes the file.
                await asyncio.wait([ahead])
                if not ahead.cancelled():
                    ahead.exception()  # retrieved: the upload's own error is the one raised


# The most one sendfile call hands the kernel (it sends what the socket takes, then the thread waits for room).
SENDFILE_SLICE = 16 << 20


class SentFile(ReadAheadFile):
    """A file sent as a form part by the kernel (``sendfile``) from a thread of its own.

    Read-ahead still copied every byte twice in this process (file to a piece, piece to the socket) and
    woke the event loop per piece: the agent's upload ran at 0.67 x curl's on the same route. Here the
    file's pages go to the socket without passing through Python. The thread sends on duplicates of the
    connection's and the file's descriptors, waiting for room with ``poll``, so the event loop is never
    blocked by the disk or the socket, keeps reading the connection (an early answer, a refusal, is seen as
    before), and a connection or file closed meanwhile cannot hand the thread someone else's descriptor.
    Exactly the part's size is sent (what the form's Content-Length counted); a file that shrank meanwhile
    ends the request with an error, which the upload retries. Where the bytes cannot go to the socket as
    they are (TLS, a chunked or compressed body, not a regular file) it is sent as :class:`ReadAheadFile`
    does."""

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        sock_fd = _plain_socket(writer)
        fh = self._value
        try:
            file_fd = fh.fileno()
            regular = stat.S_ISREG(os.fstat(file_fd).st_mode)
        except (AttributeError, OSError, ValueError):
            regular = False
        if sock_fd is None or not regular or not hasattr(os, "sendfile"):
            await super().write_with_length(writer, content_length)
            return
        self._set_or_restore_start_position()  # a retry sends the file from its start again
        offset = fh.tell()
        count = self.size or 0
        if content_length is not None:
            count = min(count, content_length)
        if writer.length is not None:  # the writer's own bound on the body, if it keeps one
            count = min(count, writer.length)
        if count <= 0:
            return
        # What was written before (the request's headers, this part's headers) leaves first: it is a few hundred
        # bytes, almost always sent at once; asyncio has no public signal for a transport's buffer running empty.
        transport = getattr(writer, "transport", None)
        while transport is not None and transport.get_write_buffer_size() and not transport.is_closing():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        # Asked again after that wait, and duplicated with no wait in between: a connection that closed meanwhile
        # may have left its descriptor's number to another one (the agent's own reconnection).
        sock_fd = _plain_socket(writer)
        if sock_fd is None:
            raise ConnectionResetError("the connection closed before the file part was sent")
        stop = threading.Event()
        sending = _start_sending(sock_fd, file_fd, offset, count, stop)
        try:
            await asyncio.shield(sending)
        finally:
            # Cancelled (the answer came early, or the upload was given up): the thread stops within its poll's
            # wait. It owns duplicates of both descriptors, so whatever the caller closes meanwhile, it never
            # sends another file or on another connection.
            stop.set()
            await asyncio.wait([sending])
            if not sending.cancelled():
                sending.exception()  # retrieved: the upload's own error is the one raised
        writer.output_size += count
        if writer.length is not None:
            writer.length -= count


def upload_body(meta: dict[str, Any], fh: Any, filename: str,
                kind: type[ReadAheadFile] = SentFile) -> aiohttp.MultipartWriter:
    """An upload's body: the ``meta`` part (JSON), then the ``file`` part, ``fh`` from its position.

    multipart/mixed, not the form-data a browser or curl sends: the same two parts, each with its
    Content-Length, which a form's parts may not carry (RFC 7578). With it the control plane reads the
    file part by its length instead of searching each piece for the boundary (aiohttp copies every piece
    twice to do that): about a sixth less of its CPU per GiB received."""
    form = aiohttp.MultipartWriter("mixed")
    form.append_json(meta).set_content_disposition("form-data", name="meta")
    octets = "application/octet-stream"
    form.append_payload(kind(fh, filename=filename, content_type=octets)).set_content_disposition(
        "form-data", name="file", filename=filename)
    return form


def _plain_socket(writer: AbstractStreamWriter) -> int | None:
    """The connection's socket descriptor when the body's bytes go to it as they are; else None."""
    if not isinstance(writer, StreamWriter) or writer.chunked or writer._compress is not None:
        return None
    transport = writer.transport
    if transport is None or transport.is_closing() or transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    try:
        return None if sock is None else int(sock.fileno())
    except (OSError, ValueError):
        return None


def _start_sending(sock_fd: int, file_fd: int, offset: int, count: int, stop: threading.Event) -> asyncio.Future[int]:
    """A thread of its own (not the event loop's shared pool, which a long upload would hold for minutes)
    that sends on duplicates of both descriptors and closes them; the future of what it sent."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    sock_dup = os.dup(sock_fd)
    try:
        fds = (sock_dup, os.dup(file_fd))
    except BaseException:
        os.close(sock_dup)
        raise

    def settle(result: int | None, exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result or 0)

    def run() -> None:
        try:
            n = _send_file(fds[0], fds[1], offset, count, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting upload, which raises it
            result: tuple[int | None, BaseException | None] = (None, exc)
        else:
            result = (n, None)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:  # the loop is closed: nobody waits for this upload any more
            pass

    try:
        threading.Thread(target=run, name="cdui-sendfile", daemon=True).start()
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return done


def _send_file(sock_fd: int, file_fd: int, offset: int, count: int, stop: threading.Event) -> int:
    """In a thread: ``count`` bytes of the file from ``offset`` to the socket (non-blocking), then both
    descriptors (duplicates) closed. Returns what was sent (less only when ``stop`` was set)."""
    sent = 0
    try:
        poller = select.poll()
        poller.register(sock_fd, select.POLLOUT)
        while sent < count and not stop.is_set():
            try:
                n = os.sendfile(sock_fd, file_fd, offset + sent, min(count - sent, SENDFILE_SLICE))
            except BlockingIOError:
                poller.poll(200)  # room in the socket, an error, or a look at ``stop``
                continue
            if n == 0:
                raise OSError(f"the file ended after {sent} of its {count} bytes: it changed while it was sent")
            sent += n
    finally:
        os.close(sock_fd)
        os.close(file_fd)
    return sent


class _Stopped(Exception):
    """The run was stopped while one of its inputs was downloading."""


def retry_delays(start: float = 1.0, cap: float = 60.0) -> Iterator[float]:
    """The waits between tries of one file through an outage (the transfer and S3 backends share them)."""
    return backoff_delays(start, cap)


class TransferFiles(Files):
    """A run on a worker without the ``data`` mount: the control plane's HTTP routes are its file store."""

    kind = "transfer"
    # more fields on the artifact event of a file that will be uploaded
    QUEUED: dict[str, Any] = {}

    def __init__(self, run_id: str, inputs: tuple[dict[str, Any], ...], user_data: Path,
                 session: aiohttp.ClientSession | None, control: str, credential: str,
                 grace_s: float, record: Callable[[str, dict[str, Any]], None],
                 stop_event: asyncio.Event) -> None:
        super().__init__(run_id)
        self.inputs: list[dict[str, Any]] = list(inputs)
        self.user_data = user_data
        self.session = session
        self.control = control.rstrip("/")
        self.credential = credential
        self.grace_s = grace_s
        self.record = record
        self.stop_event = stop_event
        self.input_shas: dict[str, str] = {}  # relative path -> sha256 as given
        self.uploaded: set[Path] = set()
        self._queue: asyncio.Queue[tuple[Path, dict[str, Any]] | None] = asyncio.Queue()
        self._held_last: list[tuple[Path, dict[str, Any]]] = []
        self._left: list[tuple[Path, dict[str, Any], str]] = []
        self._uploader: asyncio.Task[Any] | None = None
        self._retry_deadline: float | None = None

    # -- before the run ----------------------------------------------------------
    def _layout(self, job: Job, cfg: Config) -> Layout:
        self.data_dir = self.user_data / "agent-runs" / self.run_id / "data"
        layout = Layout.for_data_dir(self.data_dir, read_roots=cfg.layout.read_roots)
        layout.ensure()
        # Datasets are not sent with a run: the Dataset node reads this machine's own data folder.
        layout.folders[DATASETS_FOLDER] = cfg.layout.data_dir
        return layout

    async def fetch_inputs(self) -> bool:
        """Fetch every input (cache first). Returns False if the run was stopped meanwhile."""
        if not self.inputs:
            return True
        assert self.data_dir is not None
        cache = self.user_data / "agent-cache"
        cache.mkdir(parents=True, exist_ok=True)
        n = len(self.inputs)
        log.info("run %s: fetching %d input(s)", self.run_id, n)
        for i, inp in enumerate(self.inputs, 1):
            if self.stop_event.is_set():
                return False
            sha, folder, name = str(inp["sha256"]), str(inp["folder"]), str(inp["name"])
            if not SHA256.fullmatch(sha):
                raise RuntimeError(f"input {folder}/{name} names {sha[:80]!r} as its sha256, which is not one")
            # Folder and name together stay inside the run's data folder.
            dest = safe_join(self.data_dir, f"{folder}/{name}")
            cached = cache / sha
            how = "cached"
            if not (cached.is_file() and cached.stat().st_size == inp.get("size", cached.stat().st_size)):
                how = "fetched"
                if not await self._fetch(folder, name, sha, cached, _size(inp), f"fetching inputs {i}/{n}"):
                    return False
            dest.parent.mkdir(parents=True, exist_ok=True)
            # A copy, never a link: a node that overwrites its input cannot alter the cache.
            await asyncio.to_thread(shutil.copyfile, cached, dest)
            self.input_shas[f"{folder}/{name}"] = sha
            self.record("run_warning", {"kind": "transfer_progress", "file": name, "how": how,
                                        "message": f"fetching inputs {i}/{n}: {Path(name).name} "
                                                   f"({human_size(inp.get('size', 0))}, {how})"})
        return True

    async def _fetch(self, folder: str, name: str, sha: str, dest: Path, size: int | None = None,
                     what: str = "") -> bool:
        """Download one input into ``dest`` (whole and checked, or not at all); False if the run was stopped."""
        url = f"{self.control}/api/{folder}/download/{name}"
        delays = retry_delays()
        deadline = time.monotonic() + self.grace_s
        while True:
            try:
                # The cache entry is named by its sha256: it appears only complete and checked.
                with replacing(dest) as tmp:
                    got = await self._stream_into(url, folder, name, tmp, size, what)
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

    async def _stream_into(self, url: str, folder: str, name: str, tmp: Path, size: int | None,
                           what: str = "") -> str | None:
        """Write the answer's body to ``tmp``; its sha256, or None if the run was stopped meanwhile.

        The event loop reads the network while a thread of the writer's own hashes and writes what came
        (``HashedWriter``): the two overlap, and the pieces are handed over as the parser made them."""
        assert self.session is not None
        async with self.session.get(url, headers={"Authorization": f"Bearer {self.credential}"},
                                    read_bufsize=READ_BUFFER) as resp:
            if resp.status in RETRY_STATUSES:
                raise Unreachable(f"HTTP {resp.status}")
            if resp.status != 200:
                raise RuntimeError(f"downloading {folder}/{name} was refused: HTTP {resp.status} "
                                   f"{(await resp.text())[:300]}")
            progress = _FetchProgress(self, what, name, size) if what and size and size >= PROGRESS_MIN_BYTES \
                else None
            fh = await asyncio.to_thread(open, tmp, "wb")
            with fh:
                async with HashedWriter(fh) as out:
                    async for piece, _ in resp.content.iter_chunks():
                        if self.stop_event.is_set():
                            return None
                        if size is not None and out.size + len(piece) > size:
                            # A file that grew on the control plane would fail its sha256 anyway: stop before
                            # it fills this disk.
                            raise RuntimeError(f"{folder}/{name} arrived larger than the {size_text(size)} it had "
                                               f"when the run was queued: the file changed on the control plane")
                        await out.write(piece)
                        if progress is not None:
                            progress.at(out.size)
                    return await out.finish()

    # -- during the run ----------------------------------------------------------
    def start(self) -> None:
        self._uploader = asyncio.create_task(self._upload_loop())

    async def on_artifact(self, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrite and schedule one artifact event of the run."""
        if self.data_dir is None:
            return data
        path = Path(str(data.get("path", "")))
        # The row comes with the upload (S3: its own event once the object is in the bucket).
        out = {**data, "backend": self.kind, **self.QUEUED}
        inside = await asyncio.to_thread(inside_of, path, self.data_dir)
        if inside is None:
            return out  # not the run's (a symlink out of its folder included): never uploaded
        if inside.parts and inside.parts[0] in OUTPUT_FOLDERS:
            return out  # uploaded after the run, to the same relative path (second group)
        kind = str(data.get("kind") or "output")
        files = await asyncio.to_thread(files_of, path)
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
        delays = retry_delays()
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
        assert self.session is not None
        sha = await self._sha(path)
        size = (await asyncio.to_thread(path.stat)).st_size
        # Sent from a thread (SentFile); opening it (a slow disk's first touch) goes there too.
        fh = await asyncio.to_thread(open, path, "rb")
        with fh:
            form = upload_body({**meta, "sha256": sha, "size": size}, fh, path.name)
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

    async def finish(self, final: dict[str, Any], handle: StopCount) -> dict[str, Any]:
        """The second and third groups, then what stays on the worker. Runs before the end is reported.

        A Stop that ended the run came before this and does not count; a Stop pressed
        during these uploads leaves the rest on the worker."""
        if self.data_dir is None:
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


class _FetchProgress:
    """The in-flight lines of one large input's fetch: ``fetching inputs 1/2: big.bin 2.50 GiB of 10.0 GiB
    (25 %)`` at each quarter passed, and at least every ``PROGRESS_EVERY_S`` seconds between them."""

    def __init__(self, transfer: Any, what: str, name: str, size: int) -> None:
        self.transfer, self.what, self.name, self.size = transfer, what, Path(name).name, size
        self.file = name
        self.quarter = 0
        self.last = time.monotonic()

    def at(self, done: int) -> None:
        quarter = done * 4 // self.size
        now = time.monotonic()
        if done >= self.size or (quarter <= self.quarter and now - self.last < PROGRESS_EVERY_S):
            return  # the whole file is said by the line after it
        self.quarter, self.last = max(self.quarter, quarter), now
        self.transfer.record("run_warning", {
            "kind": "transfer_progress", "file": self.file, "how": "fetching",
            "message": f"{self.what}: {self.name} {human_size(done)} of {human_size(self.size)} "
                       f"({done * 100 // self.size} %)"})
