"""Writing bytes that arrive from the network into a file, hashed on the way, off the event loop.

The control plane receives uploads and the agent downloads inputs on the one
event loop that also serves every other request, worker and run: a write to a
slow or full disk (a network file system, a disk being flushed) must not stall
it. So the hashing and the writes run in a thread of the writer's own, while
the event loop goes on reading the network: the two overlap, as a reader and a
writer joined by a bounded queue.

- Order: one thread per writer takes the pieces in the order they came.
- Bounded: at most ``depth`` batches of about ``gather`` bytes wait for the
  thread; past that, ``write`` waits for the oldest one (memory stays flat
  whatever the file's size, and a slow disk slows the reader down).
- Pieces are gathered into batches of ``gather`` bytes before each trip (a trip
  to a thread costs about as much as hashing a few kilobytes); they are handed
  over as they are, never copied (hashlib releases the GIL for them).
- Errors: the first error of the thread (a full disk) is raised by the next
  ``write`` or by ``finish``; after it, the thread writes nothing more.
- Leaving: ``async with`` (or ``aclose``) stops the thread before the caller
  closes the file, whether it finished or not; what the thread still held is
  dropped, so a caller that gives up leaves its temporary file to discard.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import BinaryIO

GATHER = 1 << 20
DEPTH = 4


class HashedWriter:
    """Appends to an open binary file and hashes what it wrote; ``size`` counts every byte taken."""

    def __init__(self, fh: BinaryIO, gather: int = GATHER, depth: int = DEPTH) -> None:
        self._fh = fh
        self._gather = gather
        self._depth = max(1, depth)
        self._batch: list[bytes] = []
        self._batch_size = 0
        self._h = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: deque[asyncio.Future[None]] = deque()
        self._error: BaseException | None = None
        self._closed = False
        self.size = 0

    async def __aenter__(self) -> HashedWriter:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        self._raise_if_failed()
        if not isinstance(chunk, bytes):
            chunk = bytes(chunk)  # the caller may reuse its buffer; the thread reads ours later
        if not chunk:
            return
        self.size += len(chunk)
        self._batch.append(chunk)
        self._batch_size += len(chunk)
        if self._batch_size >= self._gather:
            await self._hand_over()

    async def finish(self) -> str:
        """Write what is still gathered and wait for the thread; the sha256 hex of everything written.
        The file stays open (and unflushed: the caller owns it)."""
        await self._hand_over()
        while self._inflight:
            await self._oldest_done()
        self._raise_if_failed()
        await self.aclose()
        return self._h.hexdigest()

    async def aclose(self) -> None:
        """Stop the thread: what it has not written yet is dropped. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._batch = []
        if self._error is None:
            self._error = _Closed()
        inflight, self._inflight = self._inflight, deque()
        try:
            # Every batch left now only sees the error and returns: this waits for at most the one being written.
            for fut in inflight:
                await asyncio.shield(fut)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    async def _hand_over(self) -> None:
        if not self._batch:
            return
        batch, self._batch, self._batch_size = self._batch, [], 0
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="cdui-hashed-write")
        self._inflight.append(asyncio.get_running_loop().run_in_executor(self._pool, self._put, batch))
        while len(self._inflight) > self._depth:
            await self._oldest_done()
        self._raise_if_failed()

    async def _oldest_done(self) -> None:
        # Shielded, and dropped only once done: a cancelled caller leaves it for aclose to wait on, so
        # that the thread is not writing into the file while the caller closes it.
        await asyncio.shield(self._inflight[0])
        self._inflight.popleft()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, batch: list[bytes]) -> None:
        # In the writer's thread. Never raises: the error is kept for the event loop's side, and every
        # later batch is dropped (a file with a hole in it must not be hashed as if it were whole).
        if self._error is not None:
            return
        try:
            for piece in batch:
                self._h.update(piece)
                self._fh.write(piece)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
            self._error = exc


class _Closed(RuntimeError):
    """Raised by a write after ``aclose``."""

    def __init__(self) -> None:
        super().__init__("the HashedWriter was closed")
