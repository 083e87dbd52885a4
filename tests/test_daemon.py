"""The one daemon helper behind ``cdui start/stop`` and ``cdui agent start/stop``,
on real processes (quick ones: no server, no agent)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

from cdui.cli import daemon

# Prints "ready" once its SIGTERM handling is in place, then waits.
IGNORES_TERM = "import signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
               "time.sleep(600)"
ENDS_ON_TERM = "import sys,time; print('ready', flush=True); time.sleep(600)"


def _started(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    # Reaped as soon as it ends: a daemon is never the stopping command's own child, so
    # an unreaped zombie here would look alive to the helper where a real daemon would not.
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc


def test_stop_ends_a_process_that_heeds_sigterm() -> None:
    proc = _started(ENDS_ON_TERM)
    assert daemon.stop(proc.pid, timeout=60, kill=True) == "stopped"
    assert proc.wait(timeout=60) == -15


def test_stop_kills_a_process_that_ignores_sigterm_only_when_asked() -> None:
    proc = _started(IGNORES_TERM)
    try:
        assert daemon.stop(proc.pid, timeout=0.3, kill=False) == "running"
        assert proc.poll() is None, "not killed when kill=False"
        assert daemon.stop(proc.pid, timeout=0.3, kill=True) == "killed"
        assert proc.wait(timeout=60) == -9
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_of_a_process_already_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    assert daemon.stop(proc.pid, timeout=60, kill=True) == "stopped"


def test_pidfile_names_only_a_live_process_and_is_removed_by_its_owner_only(tmp_path: Path) -> None:
    pf = daemon.PidFile(tmp_path / "x.pid")
    assert pf.running() is None, "no file"
    with pf.held():
        assert pf.path.read_text() == str(os.getpid())
        assert pf.running() == os.getpid()
    assert not pf.path.exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    pf.path.write_text(str(gone.pid))
    assert pf.running() is None, "a dead process's pid"
    with pf.held():
        pf.path.write_text("1")  # a newer daemon took the file over
    assert pf.path.read_text() == "1", "another process's file is left alone"


def test_spawn_detaches_into_a_private_log_and_wait_ready_sees_the_exit(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    code = "import os,sys; print(os.getsid(0) == os.getpid(), sys.stdin.read() == '', flush=True); sys.exit(7)"
    proc = daemon.spawn([sys.executable, "-c", code], log)
    seen: list[int | None] = []

    def check(rc: int | None) -> int | None:
        seen.append(rc)
        return rc
    assert daemon.wait_ready(proc, check, timeout=120) == 7
    assert seen[-1] == 7 and all(rc is None for rc in seen[:-1])
    assert log.read_text() == "True True\n", "its own session, stdin at end of file, output in the log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_wait_ready_gives_up_at_the_deadline() -> None:
    proc = _started(ENDS_ON_TERM)
    try:
        now = [0.0]

        def step(s: float) -> None:
            now[0] += s
        assert daemon.wait_ready(proc, lambda rc: None, timeout=5, sleep=step, monotonic=lambda: now[0]) is None
        assert now[0] >= 5
    finally:
        proc.kill()
        proc.wait(timeout=60)  # gone before the leftover-process check looks
