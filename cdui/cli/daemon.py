"""Background processes of the command line: the server (``cdui start/stop``)
and the agent (``cdui agent start/stop``) are started and stopped the same way.

- :class:`PidFile`: which process is running, written by that process itself
  and removed by it when it ends (only if it still names that process, so a
  newer daemon's file is left alone);
- :func:`spawn`: the detached child (its own session, no stdin, output
  appended to a private log, the command's relative paths made absolute first);
- :func:`wait_ready`: poll the child's own report until it says ready or
  failed, or the time is up;
- :func:`stop`: SIGTERM, wait, then (if asked) SIGKILL.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from cdui.cli.cli_util import _pid_alive, _read_pid
from cdui.core.config import absolute_paths
from cdui.core.private import open_private_append

R = TypeVar("R")
POLL_S = 0.2


class PidFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def running(self) -> int | None:
        """The pid in the file if that process is alive, else None."""
        return _read_pid(self.path)

    def remove_if(self, pid: int) -> None:
        """Remove the file if it still names ``pid`` (a killed daemon could not remove its own)."""
        try:
            if self.path.read_text().strip() == str(pid):
                self.path.unlink()
        except OSError:
            pass

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """This process is the daemon while the block runs."""
        me = str(os.getpid())
        self.path.write_text(me)
        try:
            yield
        finally:
            try:
                if self.path.read_text().strip() == me:
                    self.path.unlink()
            except OSError:
                pass


def spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` detached from this terminal, its stdout and stderr appended to ``log_path`` (0600)."""
    with open_private_append(log_path) as log:
        # Relative path settings mean the folder this command was started in, not the child's.
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[2]),
                                env=absolute_paths(os.environ, Path.cwd()))


def wait_ready(proc: subprocess.Popen[bytes], check: Callable[[int | None], R | None], timeout: float,
               sleep: Callable[[float], None] = time.sleep,
               monotonic: Callable[[], float] = time.monotonic) -> R | None:
    """Call ``check(exit code or None)`` until it answers something (returned) or ``timeout`` passes (None).

    ``check`` decides what an exit means, since each daemon reports readiness its own way."""
    deadline = monotonic() + timeout
    while monotonic() < deadline:
        answer = check(proc.poll())
        if answer is not None:
            return answer
        sleep(POLL_S)
    return None


def stop(pid: int, timeout: float, kill: bool, sleep: Callable[[float], None] = time.sleep,
         monotonic: Callable[[], float] = time.monotonic) -> str:
    """SIGTERM ``pid`` and wait up to ``timeout`` for it to end.

    Returns ``"stopped"``, ``"killed"`` (still alive at the deadline, SIGKILLed because ``kill``)
    or ``"running"`` (still alive, not killed)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "stopped"
    if wait_gone(pid, timeout, sleep, monotonic):
        return "stopped"
    if not kill:
        return "running"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return "killed"


def wait_gone(pid: int, timeout: float, sleep: Callable[[float], None] = time.sleep,
              monotonic: Callable[[], float] = time.monotonic) -> bool:
    """Wait up to ``timeout`` for ``pid`` to be gone (a SIGKILLed process still lets go of its port
    and files); True if it is."""
    deadline = monotonic() + timeout
    while _pid_alive(pid):
        if monotonic() >= deadline:
            return False
        sleep(0.05)
    return True
