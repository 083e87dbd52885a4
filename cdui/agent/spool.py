"""The agent's event spool: durable before sent, dropped only once acknowledged.

Each credential has its own spool, ``<user-data>/spool/<host>-<port>/`` (named
like its credential file ``agent/<host>-<port>.token``), and the agent that runs
with that credential holds ``spool/<host>-<port>.lock`` for as long as it runs
(:class:`SpoolLock`). Agents of several control planes share one user data
folder (every SSH worker on a shared lab account uses the account's default
folder), so an agent reads, replays, ends or removes only the runs in its own
spool, and a second agent with the same credential in the same folder is refused
before it reads anything there.

One folder per run in it, ``<user-data>/spool/<host>-<port>/<run id>/``:

- ``events.jsonl``: every event the run's recorder produced, one JSON object a
  line, appended (and fsync'ed) before the event is sent; lines of the run passed
  through as written (``protocol.Lines``) are kept as a header line
  ``{"lines": src_seq, "n": count, "bytes": size}`` followed by those bytes and a newline;
- ``acked``: the highest ``src_seq`` the control plane acknowledged, as of the last time it was
  written (every ACK_FILE_EVERY events of a flood, and whenever everything is acknowledged);
- ``state.json``: what the agent knows of the run (no secrets, ever).

After an acknowledgement the acknowledged prefix is no longer needed; the
file is compacted when the run has ended and everything is acknowledged (the
folder is removed), so a long run's spool grows only with what is unacked
while the connection is down... and with what it logged, which is bounded by
the run itself.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from bisect import bisect_right
from operator import itemgetter
from pathlib import Path
from typing import Any

from cdui.agent.instances import lock
from cdui.core.atomic import atomic_write
from cdui.core.errors import CduiError
from cdui.core.pids import pid_alive
from cdui.wire.protocol import Lines, event_text

log = logging.getLogger("cdui.agent.agent")
# What a run's spool folder holds; a folder with one of these right under spool/ is a run
# spooled by an agent from before spools were kept per credential.
RUN_FILES = ("events.jsonl", "acked", "state.json")
# How far the acknowledgements may run ahead of the ``acked`` file (see RunSpool.ack): at most this
# many acknowledged events are sent again after the agent restarts, and the control plane skips them.
ACK_FILE_EVERY = 20000
_src_seq = itemgetter("src_seq")


def _last_seq(item: Any) -> int:
    """The last src_seq of a pending item: an event, or a block of lines."""
    return item.last if type(item) is Lines else item["src_seq"]


class RunSpool:
    def __init__(self, root: Path, run_id: str) -> None:
        self.dir = root / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.dir / "events.jsonl"
        self.acked = self._read_int(self.dir / "acked")
        self._acked_written = self.acked  # what the ``acked`` file says
        self.last_seq = 0
        # Events and blocks of lines (protocol.Lines), in src_seq order.
        self.pending: list[Any] = []
        # Kept open while the run spools (the file is only ever appended to): an open, a stat, a tty check and
        # two seeks per batch, each a turn of the interpreter lock with the event loop, cost more than the write.
        self._file: Any = None
        self._size = 0  # the events file's length after the last batch written whole
        if self.events_path.exists():
            self._read(self.events_path.read_bytes(), run_id)

    def _read(self, text: bytes, run_id: str) -> None:
        pos, end = 0, len(text)
        while pos < end:
            cut = text.find(b"\n", pos)
            if cut < 0:
                return  # a torn last line after a crash: never sent; the recorder will not reuse its seq
            line, pos = text[pos:cut], cut + 1
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if "lines" in ev:
                size = int(ev["bytes"])
                if pos + size >= end:
                    return  # its lines were cut short by a crash: never sent
                block = Lines(run_id, int(ev["lines"]), text[pos:pos + size], int(ev["n"]))
                pos += size + 1
                self.last_seq = max(self.last_seq, block.last)
                if block.last > self.acked:
                    self.pending.append(block)
                continue
            self.last_seq = max(self.last_seq, int(ev["src_seq"]))
            if ev["src_seq"] > self.acked:
                self.pending.append(ev)

    @staticmethod
    def _read_int(p: Path) -> int:
        try:
            return int(p.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def append(self, events: list[dict[str, Any]], texts: list[str | None] | None = None) -> list[str]:
        """Append events, durably (one write and one fsync for the batch); each event's line as
        written, which is also how an ``events`` message carries it (sent as is, not encoded again).
        ``texts``: each event's line where the run's recorder already has it (None: encoded here)."""
        if not events:
            return []
        if texts is None:
            lines = [event_text(ev) for ev in events]
        else:
            lines = [event_text(ev) if t is None else t for ev, t in zip(events, texts, strict=True)]
        self._append(("\n".join(lines) + "\n").encode("utf-8"))
        self.last_seq = max(self.last_seq, max(map(_src_seq, events)))
        self.pending.extend(events)
        return lines

    def append_lines(self, block: Lines) -> None:
        """Append a block of the run's lines as written, durably (one write and one fsync)."""
        self._append(b'{"lines": %d, "n": %d, "bytes": %d}\n%s\n' % (block.src_seq, block.n, len(block.data),
                                                                    block.data))
        self.last_seq = max(self.last_seq, block.last)
        self.pending.append(block)

    def _append(self, data: bytes) -> None:
        """Write ``data`` at the end of the events file and make it durable."""
        fh = self._file
        if fh is None or fh.closed:
            fh = self._file = open(self.events_path, "ab", buffering=0)  # noqa: SIM115 (kept open; see close)
            self._size = os.fstat(fh.fileno()).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[fh.write(view):]
            os.fsync(fh.fileno())
        except OSError:
            # Not written whole (a full disk): the part that was is cut off again, or the next batch would
            # be read back as the rest of this one's bytes, and every block after it misread.
            with contextlib.suppress(OSError):
                os.ftruncate(fh.fileno(), self._size)
            raise
        self._size += len(data)

    def close(self) -> None:
        """Close the events file (appending opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        # A spool let go without remove() (an agent that stops with runs spooled): its file is closed here.
        if getattr(self, "_file", None) is not None:
            self.close()

    def ack(self, acked: int) -> None:
        if acked <= self.acked:
            return
        self.acked = acked
        # The file is a hint for the next start, not the record: on reconnecting, the control plane
        # answers with what it has stored and the agent acknowledges up to that (a replay of events it
        # already stored is not stored twice). So a flood writes it every ACK_FILE_EVERY events, not at
        # every acknowledgement (a file replaced per message cost more than the message's events), and
        # once everything is acknowledged, so that an idle run's spool says so.
        if acked >= self.last_seq or acked - self._acked_written >= ACK_FILE_EVERY:
            atomic_write(self.dir / "acked", str(acked))
            self._acked_written = acked
        # Pending events are in src_seq order (appended as the recorder numbered them): drop the
        # acknowledged prefix, found by halving (a step per event cost more than the rest of an ack).
        # A block of lines goes once all its lines are (the control plane skips those it has if it is sent again).
        del self.pending[:bisect_right(self.pending, acked, key=_last_seq)]

    def unacked(self) -> list[Any]:
        """What is not acknowledged yet, in order: events, and blocks of lines (``protocol.Lines``)."""
        return list(self.pending)

    def unacked_events(self) -> int:
        """How many events are not acknowledged yet (a block of lines counts its lines not acknowledged)."""
        return sum(min(item.n, item.last - self.acked) if type(item) is Lines else 1 for item in self.pending)

    def write_state(self, state: dict[str, Any]) -> None:
        atomic_write(self.dir / "state.json", json.dumps(state))

    def read_state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def spooled_runs(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def base_dir(user_data: Path) -> Path:
    return user_data / "spool"


def _legacy_runs(base: Path) -> list[Path]:
    """Run folders right under ``spool/`` (an older agent's layout)."""
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir()
                  if p.is_dir() and not p.is_symlink() and any((p / f).exists() for f in RUN_FILES))


def live_run_ids(user_data: Path) -> set[str]:
    """Every run some agent of this user data folder still spools: its run folder is in use."""
    base = base_dir(user_data)
    if not base.is_dir():
        return set()
    ids = {p.name for p in _legacy_runs(base)}
    for own in base.iterdir():
        if own.is_dir() and not own.is_symlink() and own.name not in ids:
            ids.update(spooled_runs(own))
    return ids


HOLDER_PID_WAIT_S = 2.0  # how long a refused agent reads the lock file again for its holder's pid


def _holder_pid(fd: int, wait_s: float | None = None) -> str:
    """The pid the holder of the lock on ``fd`` wrote, or "" if none shows within ``wait_s``: an
    agent that has just taken the lock writes its pid a moment later, so an empty or dead pid is
    read again for a while."""
    deadline = time.monotonic() + (HOLDER_PID_WAIT_S if wait_s is None else wait_s)
    while True:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if other.isdigit() and pid_alive(int(other)):
            return other
        if time.monotonic() >= deadline:
            return ""
        time.sleep(0.02)


class SpoolLock:
    """One agent's hold on its credential's spool in a shared user data folder."""

    def __init__(self, user_data: Path, key: str, fd: int) -> None:
        self.user_data = user_data
        self.root = base_dir(user_data) / key
        self._fd: int | None = fd

    @classmethod
    def take(cls, user_data: Path, key: str, holder: str, sole_credential: bool = False) -> SpoolLock:
        """Hold the spool of ``key`` (``<host>-<port>`` of the control plane, ``holder`` names it in
        messages), or raise ``CduiError`` if another agent of this folder holds it. ``sole_credential``:
        this is the folder's only credential, so runs an older agent spooled before spools were kept
        per credential are this agent's, and move into its spool."""
        base = base_dir(user_data)
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(base / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            lock(fd, f"the spool of {holder}")
        except BlockingIOError:
            other = _holder_pid(fd)
            os.close(fd)
            raise CduiError("agent_running", f"another agent{f' (pid {other})' if other.isdigit() else ''} "
                                             f"already runs for {holder} from {user_data}",
                            hint="one agent per control plane and user data folder: stop that one first, or "
                                 "give this one its own CODEFYUI_USER_DATA_DIR") from None
        except BaseException:
            os.close(fd)
            raise
        # Write first, then cut: the file never reads empty once a holder has written it.
        pid = f"{os.getpid()}\n".encode()
        os.pwrite(fd, pid, 0)
        os.ftruncate(fd, len(pid))
        held = cls(user_data, key, fd)
        held.root.mkdir(mode=0o700, exist_ok=True)
        held._adopt_legacy(sole_credential)
        return held

    def _adopt_legacy(self, sole_credential: bool) -> None:
        legacy = _legacy_runs(base_dir(self.user_data))
        if not legacy:
            return
        if not sole_credential:
            # Whose they are is not written anywhere: taking them could end another agent's run.
            log.warning("the spool holds %d run(s) of an older cdui (%s) and this folder has credentials for several "
                        "control planes, so they are left where they are; to deliver them, start the agent that "
                        "spooled them with only its credential in %s", len(legacy),
                        ", ".join(p.name for p in legacy), self.user_data / "agent")
            return
        for p in legacy:
            try:
                os.replace(p, self.root / p.name)
            except OSError as exc:
                log.warning("could not move the spooled run %s into %s: %s", p, self.root, exc)
        log.info("moved %d spooled run(s) of an older cdui into %s", len(legacy), self.root)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the lock
            self._fd = None
