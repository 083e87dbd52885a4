"""Whether a process is running, from its pid: for the pid files of the background server and agent, and
the pid an agent names in its spool's lock file."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Is ``pid`` a running process? A zombie (ended, not yet reaped by its parent) is not; another
    user's process is (it exists, even if this user may not signal it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read(4096)
    except OSError:
        return True  # no /proc (macOS): kill(0) is all there is to go by
    # "pid (comm) S ...": the state follows the last ")", since comm may hold one itself.
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"
