"""The log of a background server or agent: a file that rotates by size and survives logrotate.

``cdui start`` and ``cdui agent start`` (in the background) start their daemon with
``--log-file <user data>/cdui.log`` (``agent.log``). The daemon then logs through
:class:`LogFile`:

- it rotates by size: once the file would pass ``CODEFYUI_LOG_MAX_BYTES`` it becomes
  ``cdui.log.1`` (the older ones move up) and at most ``CODEFYUI_LOG_BACKUP_COUNT``
  are kept; ``0`` never rotates, for Debian's ``logrotate`` to do it;
- it follows an outside rotation: when the path no longer names the file it writes
  (logrotate renamed or removed it), the next line opens the path again, and SIGHUP
  asks for the same at once (the ``postrotate`` of a logrotate entry);
- it stays private (0600), as every file of the user data folder;
- the process's own stdout and stderr (a library's print, a traceback of a crash) are
  pointed at the current file after every open, so nothing keeps writing into a file
  that was rotated away.

Under systemd (``--foreground`` with no ``--log-file``) the log goes to stderr, which
the journal keeps; SIGHUP is then answered with a line saying there is nothing to reopen,
instead of ending the process as its default action would.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

from cdui.core.private import FILE_MODE

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("cdui.core.logfile")


class LogFile(logging.handlers.RotatingFileHandler):
    """A size-rotated, private log file that reopens its path after an outside rotation or SIGHUP."""

    def __init__(self, path: Path, max_bytes: int, backups: int, take_std: bool = True) -> None:
        self._take_std = take_std
        self.reopen_asked = False
        super().__init__(str(path), maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=False)

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
        except OSError:
            pass
        stream = os.fdopen(fd, "a", encoding=self.encoding or "utf-8", errors=self.errors)
        if self._take_std:
            for std in (1, 2):
                try:
                    os.dup2(fd, std)
                except OSError:
                    pass
        return stream

    def _moved(self) -> bool:
        """Does the path no longer name the file being written (renamed or removed by logrotate)?"""
        if self.stream is None:
            return True
        try:
            here = os.stat(self.baseFilename)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        mine = os.fstat(self.stream.fileno())
        return (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino)

    def reopen(self) -> None:
        self.acquire()
        try:
            self.reopen_asked = False
            if self.stream is not None:
                try:
                    self.stream.close()
                finally:
                    self.stream = None
            self.stream = self._open()
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.reopen_asked or self._moved():
                self.reopen()
        except OSError:
            self.handleError(record)
            return
        super().emit(record)


RING_LINES = 2000
RING_LINE_CHARS = 4096  # as cdui.wire.protocol.LOG_LINE_CHARS: a longer line is cut


class LogRing(logging.Handler):
    """The newest log lines of this process, numbered from 1, in memory: what the control plane asks an
    agent for (``cdui logs --worker``), wherever the agent's log goes (a file, or the journal)."""

    def __init__(self, size: int = RING_LINES) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[tuple[int, str]] = deque(maxlen=size)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        for line in text.splitlines() or [""]:
            self.count += 1
            self.lines.append((self.count, line[:RING_LINE_CHARS]))

    def since(self, after: int, n: int, max_chars: int) -> tuple[list[str], int, int]:
        """(up to ``n`` lines numbered after ``after`` (``0``: the last ``n``), oldest first, and at most
        ``max_chars`` in all; the oldest number still held; the number of the last line given)."""
        self.acquire()
        try:
            held = list(self.lines)
            count = self.count
        finally:
            self.release()
        first = held[0][0] if held else count + 1
        picked = held[-n:] if after <= 0 else [x for x in held if x[0] > after][:n]
        out: list[str] = []
        total = 0
        last = after if after > 0 else count  # nothing new: the caller asks again from the same place
        for seq, line in picked:
            if total + len(line) > max_chars:
                break
            out.append(line)
            total += len(line)
            last = seq
        return out, first, last


RING = LogRing()


def setup(path: Path | None, max_bytes: int, backups: int, hup: bool = True) -> LogFile | None:
    """Log INFO and above to ``path`` (rotated, see the module's doc), or to stderr when ``path`` is None,
    keep the newest lines in :data:`RING`, and answer SIGHUP (reopen the file) when ``hup``. Call once, from
    the main thread, before the event loop starts.

    A process logging to a terminal keeps SIGHUP's default: closing the terminal ends it, as before."""
    handler: LogFile | None = None
    if path is None:
        logging.basicConfig(level=logging.INFO, format=FORMAT)  # before the ring: it adds none once one is there
    else:
        handler = LogFile(path, max_bytes, backups)
        handler.setFormatter(logging.Formatter(FORMAT))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    RING.setFormatter(logging.Formatter(FORMAT))
    logging.getLogger().addHandler(RING)

    def on_hup(signum: int, frame: Any) -> None:
        # Only a flag here: the signal may arrive in the middle of writing a line. The line below is
        # logged from a thread of its own, which takes the handler's lock as any writer does.
        if handler is not None:
            handler.reopen_asked = True
        what = f"reopened {path}" if handler is not None else "nothing to reopen (logging to stderr)"
        threading.Thread(target=log.info, args=("SIGHUP: %s", what), daemon=True).start()

    if not hup or (handler is None and sys.stderr is not None and sys.stderr.isatty()):
        return handler
    try:
        signal.signal(signal.SIGHUP, on_hup)
    except (ValueError, AttributeError):  # not the main thread, or no SIGHUP (Windows)
        pass
    return handler
