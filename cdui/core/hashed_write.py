"""Writing bytes that arrive from the network into a file, hashed on the way, off the event loop.

The control plane receives uploads and the agent downloads inputs on the one
event loop that also serves every other request, worker and run: a write to a
slow or full disk (a network file system, a disk being flushed) must not stall
it. So the hashing and the writes run in a thread (of a small shared pool), while
the event loop goes on reading the network: the two overlap, as a reader and a
writer joined by a bounded queue.

- Order: a writer has at most one batch in a thread at a time; the next is
  handed over when it is done, so the pieces are written in the order they came.
- Threads: every writer shares one pool of :data:`THREADS` threads (and a
  second one as large for the writes of big batches, made while their hash is
  taken), so a thousand uploads at once (a hostile worker may open them) mean a
  thousand queued batches, not a thousand threads.
- Bounded: at most ``depth`` batches of about ``gather`` bytes wait for the
  thread; past that, ``write`` waits for the oldest one (memory stays flat
  whatever the file's size, and a slow disk slows the reader down).
- Pieces are gathered into batches of ``gather`` bytes before each trip (a trip
  to a thread costs about as much as hashing a few kilobytes); they are handed
  over as they are, never copied (hashlib releases the GIL for them).
- Errors: the first error of a write (a full disk) is raised by the next
  ``write`` or by ``finish``; after it, nothing more is written.
- Leaving: ``async with`` (or ``aclose``) waits for the batch in a thread before
  the caller closes the file, whether it finished or not; what was still waiting is
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
THREADS = 8  # the writing threads of the whole process

# A batch of this many bytes or more is written by a thread of a second pool while its hash is
# taken; a small one is not worth the trip.
OVERLAP_FROM = 64 << 10

_POOL: ThreadPoolExecutor | None = None
_IO_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(THREADS, thread_name_prefix="cdui-hashed-write")
    return _POOL


def _io_pool() -> ThreadPoolExecutor:
    """The writes' own threads: a hashing thread waits for its batch's write here, and a write never
    waits for anything, so the two pools cannot wait on each other."""
    global _IO_POOL
    if _IO_POOL is None:
        _IO_POOL = ThreadPoolExecutor(THREADS, thread_name_prefix="cdui-hashed-write-io")
    return _IO_POOL


class HashedWriter:
    """Appends to an open binary file and hashes what it wrote; ``size`` counts every byte taken."""

    def __init__(self, fh: BinaryIO, gather: int = GATHER, depth: int = DEPTH) -> None:
        self._fh = fh
        self._gather = gather
        self._depth = max(1, depth)
        self._batch: list[bytes] = []
        self._batch_size = 0
        self._h = hashlib.sha256()
        self._inflight: deque[asyncio.Future[None]] = deque()  # every batch handed over and not yet done
        self._waiting: deque[tuple[list[bytes], asyncio.Future[None]]] = deque()  # behind the one in a thread
        self._busy = False  # a batch of this writer is in a thread
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
        """Stop writing: what is not in a thread yet is dropped. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._batch = []
        if self._error is None:
            self._error = _Closed()
        # The batches not yet in a thread are dropped; this waits for at most the one being written.
        waiting, self._waiting = self._waiting, deque()
        for _batch, done in waiting:
            if not done.done():
                done.set_result(None)
        inflight, self._inflight = self._inflight, deque()
        for fut in inflight:
            await asyncio.shield(fut)

    async def _hand_over(self) -> None:
        if not self._batch:
            return
        batch, self._batch, self._batch_size = self._batch, [], 0
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight.append(done)
        self._waiting.append((batch, done))
        if not self._busy:
            self._next()
        while len(self._inflight) > self._depth:
            await self._oldest_done()
        self._raise_if_failed()

    async def _oldest_done(self) -> None:
        # Shielded, and dropped only once done: a cancelled caller leaves it for aclose to wait on, so
        # that the thread is not writing into the file while the caller closes it.
        await asyncio.shield(self._inflight[0])
        self._inflight.popleft()

    def _next(self) -> None:
        # On the event loop: the oldest waiting batch into a thread, once the one before it is done.
        if not self._waiting:
            self._busy = False
            return
        self._busy = True
        batch, done = self._waiting.popleft()
        loop = done.get_loop()

        def finished() -> None:
            if not done.done():
                done.set_result(None)
            self._next()

        def in_thread_done(_f: object) -> None:
            try:
                loop.call_soon_threadsafe(finished)
            except RuntimeError:  # the loop is closed: nobody waits for this writer any more
                pass
        _pool().submit(self._put, batch).add_done_callback(in_thread_done)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, batch: list[bytes]) -> None:
        # In the writer's thread. Never raises: the error is kept for the event loop's side, and every
        # later batch is dropped (a file with a hole in it must not be hashed as if it were whole).
        if self._error is not None:
            return
        try:
            if sum(map(len, batch)) >= OVERLAP_FROM:
                # Written by a thread of the second pool while this one hashes: both release the GIL, so
                # on two cores a batch takes the longer of the two, not their sum (hashing a GiB is about
                # 0.6 s here, copying it into the page cache 0.3 s). This thread waits for the write
                # before it returns, so a batch is still done only once it is in the file.
                wrote = _io_pool().submit(_write_all, self._fh, batch)
                try:
                    for piece in batch:
                        self._h.update(piece)
                finally:
                    wrote.result()  # the write's error, if any, is this batch's
            else:
                for piece in batch:
                    self._h.update(piece)
                    self._fh.write(piece)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
            self._error = exc


def _write_all(fh: BinaryIO, batch: list[bytes]) -> None:
    for piece in batch:
        fh.write(piece)


class _Closed(RuntimeError):
    """Raised by a write after ``aclose``."""

    def __init__(self) -> None:
        super().__init__("the HashedWriter was closed")
