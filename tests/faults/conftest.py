"""The fault suite: ``async def`` tests run in a fresh event loop each, as in
tests/inproc/ (the control plane of an in-process test lives and dies with it),
and a control plane served from a thread for the hypothesis tests, whose
examples are plain functions."""
from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from inproc.harness import Plane


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


class ThreadedPlane:
    """A :class:`Plane` whose event loop runs in a thread of its own, so that
    synchronous code (a hypothesis example) can talk to it over real sockets and
    run coroutines on its loop with :meth:`call`."""

    def __init__(self, root: Path, **settings: str) -> None:
        self.root = root
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="threaded-plane")
        self.thread.start()
        self.plane = Plane(root / "ud", root / "data", **settings)
        self.call(self.plane.__aenter__())

    def call(self, coro: Any, timeout: float = 60) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    @property
    def port(self) -> int:
        assert self.plane.server is not None and self.plane.server.port is not None
        return self.plane.server.port

    def close(self) -> None:
        try:
            self.call(self.plane.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()


@pytest.fixture(scope="module")
def threaded_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedPlane]:
    tp = ThreadedPlane(tmp_path_factory.mktemp("plane"), CODEFYUI_ENROLL_RATE_PER_MIN="1000000",
                       CODEFYUI_MAX_UPLOAD_SIZE="4096")
    try:
        yield tp
    finally:
        tp.close()
