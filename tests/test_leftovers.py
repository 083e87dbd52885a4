"""conftest's leftover-process sweep, run on a small test module of its own in
a nested pytest: what a test leaves running is ended after it (SIGTERM, then
SIGKILL for one that ignores it) and named in the output; a module fixture's
process survives its tests and is ended after the module."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import pid_alive

# A nested pytest that starts and ends real processes: the e2e tier.
pytestmark = pytest.mark.e2e

LEAKY = '''
import subprocess
import time
from pathlib import Path

import pytest

OUT = Path(__file__).parent / "pids"


def sleeping(pid):
    """Until the shell has exec'd sleep (its trap set before that), so that the sweep finds the
    process as written, however slowly a busy machine lets the shell start; returns pid."""
    deadline = time.monotonic() + 60
    while open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[0] != b"sleep":
        assert time.monotonic() < deadline, f"pid {pid} did not exec sleep"
        time.sleep(0.01)  # polling for the exec, bounded by the deadline above
    return pid


@pytest.fixture(scope="module")
def module_proc():
    # deliberately never stopped: the module sweep must end it
    return subprocess.Popen(["sleep", "303"])


def test_leaves_three(module_proc):
    child = subprocess.Popen(["sleep", "300"])
    orphan = subprocess.run(["sh", "-c", "sleep 301 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True).stdout.strip()
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 302"])
    sleeping(int(orphan))
    sleeping(stubborn.pid)
    OUT.write_text(f"{child.pid} {orphan} {stubborn.pid} {module_proc.pid}")


def test_module_process_survives_the_first_test(module_proc):
    assert module_proc.poll() is None
'''


def test_sweep_ends_what_a_test_left_and_keeps_module_fixtures(tmp_path: Path) -> None:
    tests_dir = Path(__file__).parent
    for name in ("conftest.py", "procs.py", "s3server.py", "syspkgs.py"):
        shutil.copy(tests_dir / name, tmp_path / name)
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    pids: list[int] = []
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                            "default", "test_leaky.py"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env={**__import__("os").environ, "CDUI_TEST_LEFTOVER_GRACE_S": "2"})
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        child, orphan, stubborn, module = pids
        assert "test test_leaky.py::test_leaves_three left 3 process(es) running" in out, out
        assert f"pid {child}: sleep 300 (SIGTERM)" in out
        assert f"pid {orphan}: sleep 301 (SIGTERM)" in out  # found by its marker: its parent is gone
        assert f"pid {stubborn}: sleep 302 (SIGKILL)" in out
        assert "module test_leaky.py left 1 process(es) running" in out, out
        assert f"pid {module}: sleep 303 (SIGTERM)" in out
        assert [p for p in pids if pid_alive(p)] == []
    finally:
        for p in pids:
            if pid_alive(p):
                subprocess.run(["kill", "-9", str(p)], check=False)
