"""Warm spare run processes: a run subprocess started before its run.

Starting ``python -m cdui.run.runproc`` costs about a second, nearly all of it
importing torch. A :class:`SparePool` keeps one *spare*: ``python -m
cdui.run.runproc --spare``, started ahead of need, which imports torch and the
built-in node modules and then blocks reading its stdin. The next run whose
process would be started the same way takes it; a new spare is started at
once for the run after.

Invariants:

- A spare serves one run and is never shared: once taken it is that run's
  process, exactly as a fresh one would be (its own session and process
  group, its pipes, its exit code), so a crash still ends only that run and
  stop and kill work unchanged.
- The job (secrets included) reaches a spare the same way as a fresh process:
  on its stdin, after the spare was taken. Nothing of a run is in a spare's
  argv, environment or files.
- A spare is taken only by a run that would have been started with the same
  python, working folder, umask and environment; anything else gets a fresh
  process (correct first, warm where it matches). The one exception is
  :data:`cdui.wire.job.DEFERRED_ENV` (``CUDA_VISIBLE_DEVICES``): it narrows a
  run to its card and differs per slot, so the spare is built with the
  launcher's own value and the run's value is handed over as the first line
  on stdin, which the spare applies before anything can initialise CUDA (the
  CUDA runtime reads the variable only then; the spare's warm imports do not
  initialise it).
- Plugin and custom-node folders are loaded after the job arrives, as in a
  fresh process, so a change to them counts from the next run.
- No spare outlives its owner: :meth:`SparePool.close` kills its process
  group, and an owner that dies without closing (``kill -9``) closes the
  spare's stdin, on which the spare exits.
- A spare that dies while idle is logged (with what it wrote to stderr) and
  replaced, up to :data:`MAX_IDLE_DEATHS` times in a row; after that the pool
  starts no spare until a run asks for a process again, so a broken python
  cannot make it spin.

Which owners keep one: the control plane's local executor and a long-running
agent, each from its first run on (an owner that never runs anything spends
no memory on torch). A one-shot agent keeps none: its one run is its first,
and a spare started after it would never be used.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cdui.wire.job import DEFERRED_ENV

log = logging.getLogger(__name__)

MAX_IDLE_DEATHS = 3
STREAM_LIMIT = 16 * 1024 * 1024  # the longest event line the launcher reads


@dataclass(frozen=True)
class Shape:
    """How a run process is started, but for the variables handed over per run."""

    python: str
    cwd: str
    umask: int
    env: tuple[tuple[str, str], ...]


def shape_of(python: str, cwd: str, umask: int, env: Mapping[str, str]) -> Shape:
    return Shape(python, cwd, umask, tuple(sorted((k, v) for k, v in env.items() if k not in DEFERRED_ENV)))


def handover_line(run_env: Mapping[str, str]) -> bytes:
    """The spare's first stdin line: the run's own values of the variables deferred to the handover."""
    return (json.dumps({"env": {k: run_env.get(k) for k in DEFERRED_ENV}}) + "\n").encode()


async def start_process(python: str, cwd: str, umask: int, env: Mapping[str, str],
                        spare: bool = False) -> asyncio.subprocess.Process:
    """The one place a run subprocess is started, fresh or as a spare."""
    args = ["-m", "cdui.run.runproc"] + (["--spare"] if spare else [])
    return await asyncio.create_subprocess_exec(
        python, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True,
        limit=STREAM_LIMIT, umask=umask)


def kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _Spare:
    def __init__(self, shape: Shape, env: dict[str, str], proc: asyncio.subprocess.Process) -> None:
        self.shape = shape
        self.env = env
        self.proc = proc
        self.watch: asyncio.Task[None] | None = None


_POOLS: weakref.WeakSet[SparePool] = weakref.WeakSet()


def live_pools() -> list[SparePool]:
    """Every pool of this process not yet garbage: the test suite's leftover check asks which spares
    belong to an owner that outlives one test (a module's in-process server)."""
    return list(_POOLS)


def spare_pids(pools: Iterable[SparePool]) -> set[int]:
    return {pid for pool in pools if (pid := pool.idle_pid) is not None}


class SparePool:
    """At most one idle spare, of the shape the last run had. ``enabled=False``: every run starts fresh."""

    def __init__(self, enabled: bool = True) -> None:
        _POOLS.add(self)
        self.enabled = enabled
        self._idle: _Spare | None = None
        self._closed = False
        self._idle_deaths = 0
        self._starting: set[asyncio.Task[None]] = set()
        self.taken = 0  # runs that got a spare
        self.fresh = 0  # runs that got a fresh process

    @property
    def idle_pid(self) -> int | None:
        """The idle spare's pid, None while there is none (or it is still being started)."""
        s = self._idle
        return s.proc.pid if s is not None and s.proc.returncode is None else None

    def prime(self, python: str, cwd: str, umask: int, spare_env: Mapping[str, str]) -> None:
        """Start a spare now, if there is none (an owner that wants its first run warm too)."""
        if self.enabled and not self._closed and self._idle is None and not self._starting:
            self._start_spare(shape_of(python, cwd, umask, spare_env), dict(spare_env))

    async def process(self, python: str, cwd: str, umask: int, spare_env: Mapping[str, str],
                      run_env: Mapping[str, str]) -> tuple[asyncio.subprocess.Process, bytes | None]:
        """A process for one run, and the handover line to write before its job (None: a fresh process).

        ``run_env`` is the run's environment; ``spare_env`` the same before the per-run variables
        were narrowed, which is what the next spare is built with."""
        if not self.enabled or self._closed:
            self.fresh += 1
            return await start_process(python, cwd, umask, run_env), None
        shape = shape_of(python, cwd, umask, run_env)
        s, self._idle = self._idle, None
        taken: tuple[asyncio.subprocess.Process, bytes | None] | None = None
        if s is not None:
            if s.watch is not None:
                s.watch.cancel()
            if s.shape == shape and s.proc.returncode is None:
                taken = s.proc, handover_line(run_env)
            else:
                # Built for another environment (or dead): the next run is likelier to look like this one.
                kill_group(s.proc)
                self._reap(s.proc)
        if taken is None:
            self.fresh += 1
            taken = await start_process(python, cwd, umask, run_env), None
        else:
            self.taken += 1
        self._idle_deaths = 0
        self._start_spare(shape, dict(spare_env))
        return taken

    def _start_spare(self, shape: Shape, env: dict[str, str]) -> None:
        task = asyncio.ensure_future(self._spawn(shape, env))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _spawn(self, shape: Shape, env: dict[str, str]) -> None:
        try:
            proc = await start_process(shape.python, shape.cwd, shape.umask, env, spare=True)
        except OSError as exc:  # the runs still start, fresh; say why they are not warm
            log.warning("could not start a spare run process: %s; runs start cold", exc)
            return
        if self._closed or self._idle is not None:
            kill_group(proc)
            self._reap(proc)
            return
        s = _Spare(shape, env, proc)
        s.watch = asyncio.ensure_future(self._watch(s))
        self._idle = s

    async def _watch(self, s: _Spare) -> None:
        rc = await s.proc.wait()
        if self._idle is not s:
            return
        self._idle = None
        said = b""
        if s.proc.stderr is not None:
            try:
                said = await asyncio.wait_for(s.proc.stderr.read(4000), 5)
            except (TimeoutError, OSError):
                pass
        self._idle_deaths += 1
        again = self._idle_deaths < MAX_IDLE_DEATHS and not self._closed
        log.warning("the spare run process %d exited with code %s while idle%s; %s", s.proc.pid, rc,
                    f" (stderr: {said.decode(errors='replace').strip()[-1000:]})" if said.strip() else "",
                    "starting another" if again else
                    f"{self._idle_deaths} did in a row, so none is started until the next run")
        if again:
            self._start_spare(s.shape, s.env)

    def _reap(self, proc: asyncio.subprocess.Process) -> None:
        async def reap() -> None:
            await proc.wait()
        task = asyncio.ensure_future(reap())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def settled(self) -> int | None:
        """Wait until no spare is being started; the idle spare's pid, if there is one."""
        while self._starting:
            await asyncio.gather(*list(self._starting), return_exceptions=True)
        return self.idle_pid

    async def close(self) -> None:
        """Kill the idle spare's process group and wait for it; start no other."""
        self._closed = True
        while self._starting:
            await asyncio.gather(*list(self._starting), return_exceptions=True)
        s, self._idle = self._idle, None
        if s is not None:
            if s.watch is not None:
                s.watch.cancel()
            kill_group(s.proc)
            await s.proc.wait()
