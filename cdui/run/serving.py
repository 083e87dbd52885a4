"""Warm serving processes of published apps on this machine (docs/apps.md), wherever they run: the control
plane's :class:`cdui.plane.apps.AppService` and a worker's agent (:mod:`cdui.agent.app_serving`) hold one
:class:`ServingPool` each, so an app answers the same on either.

Each active app version an invoke asks for gets a process (a canvas process, :mod:`cdui.run.canvas_proc`:
forked from the zygote, torch imported) that runs one invoke's graph after another and keeps between them
what does not depend on the inputs (its execution cache). Invariants:

- One invoke runs at a time per process; a version has up to ``per_version`` processes on a device (one
  more starts when every one is busy).
- A process ends after ``idle_timeout`` idle, when it holds more than ``max_rss`` bytes after an invoke,
  and once its version is retired and its last invoke has answered: retiring never drops an invoke in
  flight.
- A crash fails only the invoke in flight (:data:`PROCESS_LOST`, 503); invokes waiting behind it, and the
  next one, start a fresh process.
- Every process is started through the machine's one run launcher (its :class:`SparePool`) and holds no
  secret before a job arrives.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdui.core.errors import CduiError
from cdui.nodes.builtin.graph_io import GRAPH_OUTPUT_EVENT
from cdui.run import canvas_proc, runner, served
from cdui.run.spare import RunProcess, SparePool, exit_text
from cdui.wire.job import Job

log = logging.getLogger(__name__)

STOP_WAIT_S = 5.0  # how long an invoke past its timeout has to end after its stop, before its process is killed
SWEEP_EVERY_S = 5.0
STDERR_KEPT = 20  # the last lines of a warm process's stderr, for the message when it dies
# The start of the event lines an invoke reads (the run process writes "kind" first: cdui/run/runproc.py).
_WANTED = (b'{"kind": "' + GRAPH_OUTPUT_EVENT.encode() + b'"', b'{"kind": "result"')
LOST = "the app's serving process ended during this invoke; the next invoke starts a new one"
PROCESS_LOST = "app_process_lost"

# (slug, version, device, index): one process of a version on a device.
ProcKey = tuple[str, int, str, int]


@dataclass
class Call:
    """One invoke on a warm process: what its graph's GraphOutputs gave, and its end."""
    done: asyncio.Future[dict[str, Any]]
    outputs: dict[str, Any] = field(default_factory=dict)
    output_error: dict[str, Any] | None = None


class WarmProcess:
    """One app version's serving process, seen from the process that started it."""

    def __init__(self, slug: str, version: int, slot: str, proc: RunProcess, index: int = 0,
                 version_id: str = "") -> None:
        self.slug, self.version, self.slot, self.proc, self.index = slug, version, slot, proc, index
        self.version_id = version_id  # what the process was told it serves (its version line)
        self.lock = asyncio.Lock()  # one invoke at a time
        self.waiting = 0  # invokes holding or waiting for the lock
        self.current: Call | None = None
        self.last_used = time.monotonic()
        self.retired = False  # its version is no longer active: it ends once its last invoke has answered
        self.invokes = 0
        self.exited = asyncio.Event()
        self.stderr: list[str] = []
        self.ending: str | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.on_exit: Callable[[WarmProcess], None] | None = None  # told once the process has ended

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.exited.is_set()

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr()),
                      asyncio.ensure_future(self._watch())]

    async def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue  # longer than any event may be: dropped
            if not line:
                return
            call = self.current
            # Only two kinds of line matter here; the others (node statuses, logs) are not decoded at all.
            if call is None or call.done.done() or not line.startswith(_WANTED):
                continue
            try:
                ev = json.loads(line)
                kind, data = ev["kind"], ev.get("data")
            except (ValueError, KeyError, TypeError):
                continue
            if kind == GRAPH_OUTPUT_EVENT and isinstance(data, dict):
                if "error" in data and call.output_error is None:
                    call.output_error = {**data["error"], "node_id": data.get("node_id")}
                elif "value" in data:
                    call.outputs[str(data.get("name"))] = data["value"]
            elif kind == "result" and isinstance(data, dict):
                call.done.set_result(data)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode(errors="replace").rstrip("\n")
            if text.strip():
                self.stderr = [*self.stderr[-(STDERR_KEPT - 1):], text[:1000]]
                log.debug("app %s v%d process %s: %s", self.slug, self.version, self.proc.pid, text[:1000])

    async def _watch(self) -> None:
        rc = await self.proc.wait()
        await asyncio.gather(*self.tasks[:2], return_exceptions=True)
        self.exited.set()
        if self.on_exit is not None:
            self.on_exit(self)
        call, self.current = self.current, None
        if call is not None and not call.done.done():
            why = self.ending or exit_text(self.proc, rc)
            call.done.set_exception(CduiError(
                PROCESS_LOST, f"app {self.slug!r} version {self.version}: the {why}; {LOST}",
                hint="call again: a new process serves it", status=503,
                details={"stderr_tail": self.stderr[-5:]}))

    async def call(self, inputs: dict[str, Any], timeout: float) -> tuple[dict[str, Any], Call]:
        """Run one invoke of the process's version with ``inputs`` (GraphInput node id -> value); its result line
        and what its outputs gave. Holds :attr:`lock`."""
        if not self.alive:
            raise CduiError(PROCESS_LOST, f"app {self.slug!r} version {self.version}: its serving process "
                            f"has ended; {LOST}", hint="call again", status=503)
        call = Call(asyncio.get_running_loop().create_future())
        self.current = call
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(served.invoke_line(self.version_id, inputs).encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            pass  # the process is gone: its watch fails the call
        try:
            result = await asyncio.wait_for(asyncio.shield(call.done), timeout)
        except TimeoutError:
            await self._stop(call)
            raise CduiError("timeout", f"the invoke did not end within {timeout:g} s; it was stopped",
                            hint="raise timeout_s, or make the graph faster", status=504) from None
        finally:
            if self.current is call:
                self.current = None
            self.invokes += 1
            self.last_used = time.monotonic()
        return result, call

    async def _stop(self, call: Call) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((canvas_proc.STOP + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            return
        try:
            await asyncio.wait_for(asyncio.shield(call.done), STOP_WAIT_S)
        except Exception:  # noqa: BLE001 - it did not end (or its process died): a fresh one serves the next
            self.kill("it did not stop within its invoke's timeout")
            # Gone before the lock is let go: the invoke waiting for it must find it dead, not write to it.
            await self.exited.wait()
            if call.done.done():
                call.done.exception()  # its loss is this timeout's, already answered

    def kill(self, why: str) -> None:
        self.ending = self.ending or why
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        return {"slug": self.slug, "version": self.version, "pid": self.proc.pid, "device": self.slot,
                "state": "busy" if self.current is not None else "idle", "waiting": self.waiting,
                "invokes": self.invokes, "idle_s": round(time.monotonic() - self.last_used, 1),
                "rss_bytes": rss_bytes(self.proc.pid), "retired": self.retired}


def no_slot(slot: str, slug: str, version: int, waited: float) -> CduiError:
    """The answer to an invoke whose version's first serving process found no slot of ``slot`` (a device, or
    "DEVICE on worker W") within its timeout."""
    return CduiError("timeout", f"no slot of {slot} came free within {waited:g} s for app {slug!r} version "
                     f"{version}'s serving process: runs or other apps' processes hold every one",
                     hint="call again later, or give the device more slots (CODEFYUI_RUN_QUEUE_MAX_CONCURRENT)",
                     status=504)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int | None:
    """The process's resident memory (VmRSS), from its one-line ``statm``: read after every invoke."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class PoolLimits:
    """The bounds of one machine's serving processes, from its ``CODEFYUI_APP_*`` settings."""
    idle_timeout: float
    max_rss: int  # bytes; 0: no bound
    per_version: int
    cache_max: int  # bytes of a process's execution cache

    @classmethod
    def from_config(cls, cfg: Any) -> PoolLimits:
        return cls(float(cfg["CODEFYUI_APP_IDLE_TIMEOUT_S"]), int(cfg["CODEFYUI_APP_MAX_RSS_MB"]) * 1024 * 1024,
                   int(cfg["CODEFYUI_APP_PROCESSES"]), int(cfg["CODEFYUI_CANVAS_CACHE_MAX_MB"]) * 1024 * 1024)


class SlotGate(Protocol):
    """The device slots serving processes take, where a scheduler shares them with runs (the control plane's:
    :meth:`cdui.plane.runs.RunService.take_app_slot`). A slot taken is given back once the started process
    holds its own (the pool's ``on_change`` reports it), or when none started."""

    def try_take(self, slot: str) -> bool: ...

    async def take(self, slot: str, timeout: float) -> None: ...  # TimeoutError when none came in time

    def release(self, slot: str) -> None: ...


class ServingPool:
    """This machine's serving processes, by app version and device. ``on_change`` is told whenever a process
    starts or ends (the agent reports its processes to the control plane then). With a ``gate``, the first
    process of a version on a device waits for a slot of it, and a further one starts only on a free slot
    (its invokes otherwise wait for the version's processes); without one (a worker's agent: the control
    plane takes the slot before it sends a cold invoke), processes start as invokes need them."""

    def __init__(self, spares: SparePool, limits: PoolLimits, on_change: Callable[[], None] | None = None,
                 gate: SlotGate | None = None) -> None:
        self.spares = spares
        self.limits = limits
        self.on_change = on_change
        self.gate = gate
        self.procs: dict[ProcKey, WarmProcess] = {}
        self._starting: dict[ProcKey, asyncio.Lock] = {}
        self._launching: set[ProcKey] = set()  # processes being started
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def close(self, why: str = "the server stopped") -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for p in list(self.procs.values()):
            await self._end(p, why)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(SWEEP_EVERY_S, max(0.5, self.limits.idle_timeout / 4)))
            now = time.monotonic()
            for p in list(self.procs.values()):
                if not p.alive:
                    self._forget(p)
                elif p.waiting == 0 and now - p.last_used > self.limits.idle_timeout:
                    log.info("app %s v%d: its process %s was idle %.0f s: ended", p.slug, p.version, p.proc.pid,
                             now - p.last_used)
                    await self._end(p, "idle")

    def _forget(self, p: WarmProcess) -> None:
        key = (p.slug, p.version, p.slot, p.index)
        if self.procs.get(key) is p:
            del self.procs[key]
            self._changed()

    async def _end(self, p: WarmProcess, why: str) -> None:
        self._forget(p)
        if p.proc.stdin is not None:
            with contextlib.suppress(Exception):
                p.proc.stdin.close()
        p.kill(why)
        await p.exited.wait()

    async def retire(self, slug: str, keep: int | None) -> None:
        """Every process of ``slug`` but version ``keep``'s ends, each once its invokes have answered."""
        for p in list(self.procs.values()):
            if p.slug == slug and p.version != keep:
                p.retired = True
                self._forget(p)
                if p.waiting == 0:
                    await self._end(p, "its version is no longer the active one")

    def forget_app(self, slug: str) -> None:
        for lock_key in [k for k in self._starting if k[0] == slug]:
            del self._starting[lock_key]

    async def _process(self, slug: str, version: int, slot: str, job: Job, timeout: float) -> WarmProcess:
        """An idle process of this version on ``slot``; else a new one while there are fewer than
        ``per_version`` (started or starting) and, after the first, a slot is free; else the one with the
        fewest invokes waiting."""
        while True:
            pool = [p for (s, v, d, _i), p in self.procs.items() if (s, v, d) == (slug, version, slot) and p.alive]
            idle = [p for p in pool if p.waiting == 0]
            if idle:
                return idle[0]
            launching = [k for k in self._launching if k[:3] == (slug, version, slot)]
            taken = {p.index for p in pool} | {k[3] for k in launching}
            free = [i for i in range(self.limits.per_version) if i not in taken]
            if free and not pool and not launching:
                return await self._start(slug, version, slot, free[0], job, timeout)  # the first: waits for a slot
            if free and (self.gate is None or self.gate.try_take(slot)):
                return await self._start(slug, version, slot, free[0], job, None)
            if pool:
                return min(pool, key=lambda p: p.waiting)
            # Every process this version may have is still starting: wait for one, then choose again.
            async with self._starting.setdefault(launching[0], asyncio.Lock()):
                pass

    async def _start(self, slug: str, version: int, slot: str, index: int, job: Job,
                     slot_wait: float | None) -> WarmProcess:
        """Start process ``index`` of the version on ``slot``. With a gate: ``slot_wait`` None means its slot was
        taken already (try_take), else it waits up to that long for one."""
        key = (slug, version, slot, index)
        self._launching.add(key)  # before any wait: invokes arriving meanwhile count it as taken
        try:
            async with self._starting.setdefault(key, asyncio.Lock()):
                if self.gate is not None and slot_wait is not None:
                    try:
                        await self.gate.take(slot, slot_wait)
                    except TimeoutError:
                        raise no_slot(slot, slug, version, slot_wait) from None
                try:
                    return await self._launch(slug, version, slot, index, job)
                finally:
                    if self.gate is not None:
                        self.gate.release(slot)  # the process holds its own slot now (or none started)
        finally:
            self._launching.discard(key)

    async def _launch(self, slug: str, version: int, slot: str, index: int, job: Job) -> WarmProcess:
        key = (slug, version, slot, index)
        env, _device = runner.run_env(slot)
        proc = await self.spares.process(*runner.process_shape(), env)
        assert proc.stdin is not None
        hello = {"tab": f"app-{slug}", "cache_max_bytes": self.limits.cache_max}
        # The version once: each invoke then sends only its inputs (cdui/run/served.py).
        version_id = job.run_id
        proc.stdin.write((canvas_proc.HELLO + json.dumps(hello) + "\n" + served.version_line(version_id, job)).encode())
        await proc.stdin.drain()
        p = WarmProcess(slug, version, slot, proc, index, version_id)
        # A process that ends (a crash, a kill) gives its slot back at once, not at the next sweep.
        p.on_exit = self._forget
        p.start()
        self.procs[key] = p
        log.info("app %s v%d: process %s started on %s", slug, version, proc.pid, slot)
        self._changed()
        return p

    async def run(self, slug: str, version: int, slot: str, job: Job, inputs: dict[str, Any],
                  timeout: float) -> tuple[dict[str, Any], Call]:
        """Run one invoke on a process of this version on ``slot``: its result line and outputs. ``job`` is the
        version's (its GraphInputs without the caller's values), sent once to each process it starts;
        ``inputs`` the caller's values by GraphInput node id."""
        while True:
            p = await self._process(slug, version, slot, job, timeout)
            p.waiting += 1
            try:
                async with p.lock:
                    if p.alive:
                        return await p.call(inputs, timeout)
                # It died while this invoke waited behind another: this one runs on a fresh process.
            finally:
                p.waiting -= 1
                await self._after(p)

    async def _after(self, p: WarmProcess) -> None:
        if not p.alive or p.waiting:
            return
        rss = rss_bytes(p.proc.pid) if self.limits.max_rss > 0 else None
        if p.retired:
            await self._end(p, "its version is no longer the active one")
        elif rss is not None and rss > self.limits.max_rss:
            log.warning("app %s v%d: its process %s holds %d MB, over CODEFYUI_APP_MAX_RSS_MB=%d: ended",
                        p.slug, p.version, p.proc.pid, rss // 2**20, self.limits.max_rss // 2**20)
            await self._end(p, "over its memory bound")

    def describe(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.procs.values() if p.alive]

    def warm(self, slug: str, version: int) -> bool:
        """Whether a live process of this version is here."""
        return any(p.alive and (p.slug, p.version) == (slug, version) for p in self.procs.values())

    async def end_idle(self, min_idle_s: float, devices: Callable[[str], bool]) -> int:
        """End every process on a device ``devices`` accepts that has had no invoke for ``min_idle_s`` (its slot
        is wanted by a run); how many."""
        now = time.monotonic()
        idle = [p for p in self.procs.values() if p.alive and p.waiting == 0 and p.current is None
                and now - p.last_used >= min_idle_s and devices(p.slot)]
        for p in idle:
            log.info("app %s v%d: its idle process %s gives its slot on %s to a queued run", p.slug, p.version,
                     p.proc.pid, p.slot)
            await self._end(p, "its slot was wanted by a queued run")
        return len(idle)

    def slots(self) -> list[str]:
        """The device of each live process (one entry per process): the slots serving holds."""
        return [p.slot for p in self.procs.values() if p.alive]
