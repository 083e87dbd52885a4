"""What both halves of the command line share (``cli.py`` and ``cli_workers.py``),
so that neither imports the other's internals: the one error line, pidfiles."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cdui.agent.spool import SpoolLock
from cdui.core.errors import CduiError
from cdui.core.pids import pid_alive as _pid_alive

CONTROL_HELP = "the control plane's URL (default: the one `cdui start` recorded in the user data folder)"


def _die(msg: str, code: int = 1) -> int:
    """Print the one error line ``cdui: error: ...`` on stderr and return ``code``."""
    print(f"cdui: error: {msg}", file=sys.stderr)
    return code


def _read_pid(path: Path) -> int | None:
    """The pid in ``path`` if that process is alive, else None."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def hold_spool(user_data: Path, control: str, cred: dict[str, Any]) -> SpoolLock | int:
    """This credential's spool in ``user_data`` (cdui/agent/spool.py), or exit code 2 if another agent runs with it."""
    from cdui.agent.agent import credential_key
    creds = list((user_data / "agent").glob("*.token"))
    try:
        return SpoolLock.take(user_data, credential_key(control), f"worker {cred['name']} of {control}",
                              sole_credential=[p.stem for p in creds] == [credential_key(control)])
    except CduiError as err:
        return _die(str(err), 2)
