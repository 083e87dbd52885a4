"""A control plane in the test process, for tests written against ``ServerProc``.

``InProcServer`` serves the same app as ``cdui start`` (a :class:`harness.Plane`:
``build_app(config, clock)`` on a real loopback port over a real sqlite file)
from an event loop in a background thread, and answers the same synchronous
HTTP helpers as ``procs.ServerProc`` (``raw``, ``api``, ``call``, ``upload``,
``submit``, ``events``, ``port``, ``token``, ``user_data``...). A test moved here
from a process test keeps its body: only its fixture changes, and it no longer
waits for an interpreter to start. Local runs still execute in real run
subprocesses. What needs a real server process (its log, signals, ``kill -9``,
the peer credentials of its socket) stays with ``ServerProc``.

The server's log records (``cdui.*``, ``aiohttp.*``, at the test process's
logging level) go to ``log_path`` while it runs, for ``log_text()``; what a
server process writes to its stderr outside logging is not there, which is why
the secret tests keep a real process.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from harness import Plane

from cdui.core.clock import Clock, SystemClock
from procs import ServerProc

T = TypeVar("T")
START_TIMEOUT_S = 120.0


class InProcServer(ServerProc):
    def __init__(self, tmp: Path, name: str = "server", user_data: Path | None = None,
                 data_dir: Path | None = None, extra_env: dict[str, str] | None = None,
                 clock: Clock | None = None) -> None:
        super().__init__(tmp, name=name, user_data=user_data, data_dir=data_dir, extra_env=extra_env)
        # Real time by default: these tests step no clock, and local runs wait on it (stop grace).
        self.clock: Clock = clock or SystemClock()
        self.plane: Plane | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._log: logging.Handler | None = None

    def _in_loop(self, coro: Coroutine[Any, Any, T], timeout: float = START_TIMEOUT_S) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, extra_env: dict[str, str] | None = None, timeout: float = START_TIMEOUT_S) -> InProcServer:
        assert self.plane is None, "already started"
        if extra_env:
            self.extra_env.update(extra_env)
        self.user_data.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = logging.FileHandler(self.log_path)
        self._log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in ("cdui", "aiohttp"):
            logging.getLogger(name).addHandler(self._log)
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=f"inproc-{self.name}", daemon=True)
        self._thread.start()
        plane = Plane(self.user_data, self.data_dir, self.clock, **self.extra_env)  # type: ignore[arg-type]
        self._in_loop(plane.__aenter__(), timeout)
        self.plane = plane
        assert plane.server is not None and plane.server.port is not None
        self.port = plane.server.port
        return self

    def stop(self, timeout: float = 60) -> int | None:
        if self.plane is None:
            return None
        try:
            self._in_loop(self.plane.close(), timeout)
        finally:
            assert self._loop is not None and self._thread is not None
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._loop.close()
            for name in ("cdui", "aiohttp"):
                if self._log is not None:
                    logging.getLogger(name).removeHandler(self._log)
            if self._log is not None:
                self._log.close()
            self.plane = self._loop = self._thread = self._log = None
        return 0

    def restart(self, extra_env: dict[str, str] | None = None) -> InProcServer:
        self.stop()
        return self.start(extra_env)

    @property
    def pid(self) -> int | None:
        return os.getpid()  # the server is this process

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def returncode(self) -> int | None:
        return None

    def kill9(self) -> None:
        raise NotImplementedError("an in-process server cannot be killed: use ServerProc (e2e) for kill -9")
