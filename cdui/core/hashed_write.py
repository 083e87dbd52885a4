"""Writing bytes that arrive from the network into a file, hashed on the way, off the event loop.

The control plane receives uploads and the agent downloads inputs on the one
event loop that also serves every other request, worker and run: a write to a
slow or full disk (a network file system, a disk being flushed) must not stall
it. So the hashing and the writes run in a thread. The network hands over small
pieces (often 64 KiB), and each trip to a thread costs about as much as hashing
a few kilobytes, so pieces are gathered into 1 MiB before each trip.
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import BinaryIO

GATHER = 1 << 20


class HashedWriter:
    """Appends to an open binary file and hashes what it wrote; ``size`` counts every byte taken."""

    def __init__(self, fh: BinaryIO, gather: int = GATHER) -> None:
        self._fh = fh
        self._gather = gather
        self._buf = bytearray()
        self._h = hashlib.sha256()
        self.size = 0

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self._buf += chunk
        if len(self._buf) >= self._gather:
            await self._flush()

    async def finish(self) -> str:
        """Write what is still gathered; the sha256 hex of everything written. The file stays open."""
        await self._flush()
        return self._h.hexdigest()

    async def _flush(self) -> None:
        if self._buf:
            await asyncio.to_thread(self._put, self._buf)
            self._buf = bytearray()  # a fresh buffer: the thread may still hold the old one if we were cancelled

    def _put(self, data: bytearray) -> None:
        self._h.update(data)
        self._fh.write(data)
