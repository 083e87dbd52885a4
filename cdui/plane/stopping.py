"""Did the last server die in the middle of its own stop?

A graceful stop first tells every worker to stop its runs and asks the local
ones to stop, then waits for their endings. ``cdui stop`` does not wait for
all of that: it kills the server about 2 s after asking (systemd does the
same at its stop timeout). The runs whose ending had not been stored by then
were already told to stop, so the next start must not adopt them as it adopts
the runs of a server that crashed while they ran: they end ``interrupted``.

The mark is a file in the user data folder, written when the stop begins and
removed when it has ended every run; the next start reads and removes it.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from cdui.core.atomic import write_private

log = logging.getLogger("cdui.plane.runs")
FILE = "server-stopping"


def begin(user_data: Path) -> None:
    try:
        write_private(user_data / FILE, f"{time.time():.3f}\n")
    except OSError as exc:  # the stop goes on; only a kill in the middle of it is then taken for a crash
        log.warning("could not write %s: %s", user_data / FILE, exc)


def end(user_data: Path) -> None:
    with contextlib.suppress(OSError):
        (user_data / FILE).unlink()


def take(user_data: Path) -> bool:
    """True if the previous server was killed while it was stopping (the mark is removed)."""
    path = user_data / FILE
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
    return True
