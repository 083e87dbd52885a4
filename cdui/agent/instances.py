"""Agent instances on the worker side: IDs, their folders, and the locks in a shared user data folder.

Many one-shot agents (the tasks of a SLURM array) share one credential and one
``<user data>`` folder; each is an *instance* with its own ID and its own files
in ``<user data>/agent-instances/<ID>/`` (spool, run folders, input cache),
removed when it exits. Invariants:

- an ID is held by one agent at a time: the holder keeps an exclusive lock on
  ``agent-instances/.<ID>.lock`` (beside the folder, so a second agent with
  that ID exits before it touches the folder);
- a folder left by a killed instance is removed by a later instance, only when
  no agent holds its lock and nothing in it changed for :data:`STALE_AFTER_S`;
- on a filesystem without file locks (Lustre mounted ``noflock``, some NFS) a
  lock is a warning and no lock, never a failure: the tasks still run.

The default ID comes from the SLURM environment (:func:`default_id`), so the
tasks of an array are ``<array job>-<task>``.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from cdui.core.errors import CduiError

STALE_AFTER_S = 24 * 3600.0
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # the same rule as the control plane's
# What flock answers on a filesystem that has no locks at all (not "someone holds it").
NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
Flock = Callable[[int, int], None]


def default_id(env: Mapping[str, str], rand: Callable[[int], str] = secrets.token_hex) -> str:
    """``<SLURM_ARRAY_JOB_ID>-<SLURM_ARRAY_TASK_ID>`` in an array task, ``SLURM_JOB_ID`` in another
    job, else 16 random hex characters; inside a job step ``-<SLURM_STEP_ID>-<SLURM_PROCID>`` follows,
    so each task of ``srun -n 4`` has its own."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        base = f"{env['SLURM_ARRAY_JOB_ID']}-{env['SLURM_ARRAY_TASK_ID']}"
    elif env.get("SLURM_JOB_ID"):
        base = env["SLURM_JOB_ID"]
    else:
        return rand(8)
    if env.get("SLURM_STEP_ID") and env.get("SLURM_PROCID"):
        base += f"-{env['SLURM_STEP_ID']}-{env['SLURM_PROCID']}"
    return base


def check_id(value: str) -> str:
    if not ID_RE.match(value):
        raise CduiError("bad_usage", f"--instance {value[:80]!r} is not a valid instance ID",
                        hint="use 1-64 letters, digits, '_' or '-', starting with a letter or digit")
    return value


def lock(fd: int, what: str, wait_message: str | None = None, flock: Flock = fcntl.flock) -> bool:
    """Take an exclusive lock on ``fd``. True: held. False: this filesystem has no locks (warned).

    With ``wait_message`` a held lock is waited for (the message says so); without, the
    holder's ``BlockingIOError`` goes to the caller."""
    try:
        flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if wait_message is None:
            raise
        print(f"cdui: {wait_message}", file=sys.stderr, flush=True)
        flock(fd, fcntl.LOCK_EX)
        return True
    except OSError as exc:
        if exc.errno not in NO_LOCK_ERRNOS:
            raise
        print(f"cdui: warning: this filesystem does not support file locks ({exc.strerror}), so {what} goes "
              f"on without a lock; enroll once before starting many agents together, and give each task its "
              f"own --instance ID", file=sys.stderr, flush=True)
        return False


def newest_change(folder: Path) -> float:
    """The latest mtime of ``folder`` and anything in it, links not followed."""
    newest = folder.lstat().st_mtime
    for root, dirs, files in os.walk(folder, followlinks=False):
        for n in dirs + files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime)
    return newest


class Instance:
    """One instance's claim on its ID and folder in a user data folder."""

    def __init__(self, user_data: Path, instance_id: str, flock: Flock = fcntl.flock) -> None:
        self.root = user_data / "agent-instances"
        self.id = check_id(instance_id)
        self.folder = self.root / self.id
        self._flock = flock
        self._fd: int | None = None

    def lock_path(self, instance_id: str) -> Path:
        return self.root / f".{instance_id}.lock"

    def claim(self) -> None:
        """Hold the ID, or raise ``CduiError`` (exit 2) if an agent already does; nothing of the
        folder is touched before the lock is held."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.lock_path(self.id), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            lock(fd, f"instance {self.id}", flock=self._flock)
        except BlockingIOError:
            os.close(fd)
            raise CduiError("instance_running", f"an agent with instance ID {self.id} is already running in "
                                                f"{self.root.parent}", hint="give this agent another --instance "
                                                                            "ID, or stop the other one") from None
        self._fd = fd
        # A folder left by a killed agent with this same ID: its run is over (ours is a new one).
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(mode=0o700)

    def sweep_stale(self, now: float | None = None, max_age: float = STALE_AFTER_S) -> list[str]:
        """Remove folders of killed instances: no agent holds their ID and nothing changed in them
        for ``max_age`` seconds. Returns the IDs removed."""
        now = time.time() if now is None else now
        removed = []
        for entry in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if entry.name == self.id or entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink():
                continue
            lock_path = self.lock_path(entry.name)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    if not lock(fd, f"the cleanup of instance {entry.name}", flock=self._flock):
                        pass  # no locks here: the age alone decides
                except BlockingIOError:
                    continue  # its agent is alive
                if now - newest_change(entry) < max_age:
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                lock_path.unlink(missing_ok=True)
                removed.append(entry.name)
            finally:
                os.close(fd)
        return removed

    def release(self) -> None:
        """At exit: the folder goes (an undelivered result goes with it), then the ID is free."""
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._fd is not None:
            self.lock_path(self.id).unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def held(instance: Instance) -> Iterator[Instance]:
    instance.claim()
    try:
        yield instance
    finally:
        instance.release()
