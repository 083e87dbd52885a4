"""What both halves of the command line share (``cli.py`` and ``cli_workers.py``),
so that neither imports the other's internals: the one error line, pidfiles."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def _die(msg: str, code: int = 1) -> int:
    """Print the one error line ``cdui: error: ...`` on stderr and return ``code``."""
    print(f"cdui: error: {msg}", file=sys.stderr)
    return code


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    """The pid in ``path`` if that process is alive, else None."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None
