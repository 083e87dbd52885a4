"""Is a worker on this very machine, sharing its files? Decided by a test only such an agent passes.

A worker "on the same machine" gets the control plane's data folder as its
mount label, its runs keep the control plane's paths (data folders, plugins,
custom nodes), and the control plane's own plugin types count as its node
types. An agent's machine id cannot decide that alone: a VM cloned from this
one carries the same ``/etc/machine-id``, any worker can claim it, and an
agent of another OS user on this very host shares the id but not the right to
write here (a run of it then fails at its end, writing a model it cannot).

So, only for an agent whose hello names this machine's id (the id is the hint
that a test is worth it), the control plane writes a fresh random nonce into a
new file in its data folder and, before the welcome, asks the agent to read
that file and to create a file in each folder its runs write to. The agent
is on this machine, seeing these very folders, only when it read the nonce
and could write every folder; any other agent is treated as another machine,
whatever its id: its runs move their files through the control plane.

:func:`judge` is the pure decision; :func:`write_nonce` and :func:`answer`
are the two sides' I/O.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cdui.wire.protocol import Probe, ProbeAnswer

# The folders runs write into (ModelSaver and checkpoints, media, outputs); reading the others
# is shown by reading the nonce file beside them.
WRITE_FOLDERS = ("models", "media", "output")
PREFIX = ".cdui-probe-"
PROBE_TIMEOUT_S = 30.0
MAX_NONCE = 128


@dataclass(frozen=True)
class Verdict:
    same: bool
    # Why an agent that named this machine's id is not taken as on it (None otherwise).
    note: str | None = None


def judge(nonce: str, found: ProbeAnswer | None, why_none: str = "it did not answer the probe") -> Verdict:
    """The verdict on an agent that named this machine's id, from what it found."""
    if found is None:
        return Verdict(False, f"it names this machine's id but {why_none}")
    if found.nonce is None or not secrets.compare_digest(found.nonce, nonce):
        reason = found.cannot_read or "it read another nonce (a copy of this machine, or a claimed id)"
        return Verdict(False, f"it names this machine's id but cannot read this control plane's data folder: "
                              f"{reason}")
    if found.cannot_write:
        folder, reason = next(iter(found.cannot_write.items()))  # the first in the probe's order
        return Verdict(False, f"it runs on this machine but cannot write {folder} ({reason}), so its runs move "
                              f"their files through the control plane")
    return Verdict(True)


def write_nonce(data_dir: Path) -> tuple[Path, str]:
    """A new file in ``data_dir`` holding a fresh nonce, readable by every local user (an agent of another
    OS user must be able to read it, or it is not sharing these folders); the caller removes it."""
    nonce = secrets.token_hex(16)
    path = data_dir / f"{PREFIX}{secrets.token_hex(8)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the server's umask
        os.write(fd, nonce.encode())
    finally:
        os.close(fd)
    return path, nonce


def remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def answer(probe: Probe) -> ProbeAnswer:
    """The agent's side: read the nonce, try to create (and remove) a file in each folder.

    Only a file named as the control plane names its nonce files is read, and only a few bytes of it."""
    nonce: str | None = None
    cannot_read: str | None = None
    if not Path(probe.nonce_file).name.startswith(PREFIX):
        cannot_read = f"{probe.nonce_file!r} is not a probe file"
    else:
        try:
            with open(probe.nonce_file, "rb") as fh:
                nonce = fh.read(MAX_NONCE).decode("ascii", errors="replace")
        except OSError as exc:
            cannot_read = f"{type(exc).__name__}: {exc.strerror or exc}"
    cannot_write: dict[str, str] = {}
    if nonce is not None:
        for folder in probe.folders:
            test = Path(folder) / f"{PREFIX}{secrets.token_hex(8)}"
            try:
                os.close(os.open(test, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                os.unlink(test)
            except OSError as exc:
                cannot_write[folder] = f"{type(exc).__name__}: {exc.strerror or exc}"
    return ProbeAnswer(nonce, cannot_read, cannot_write)
