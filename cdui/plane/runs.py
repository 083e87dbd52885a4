"""The run service: submit, queue, dispatch, record, stop, delete.

This is the core of the control plane; HTTP handlers only translate requests
into calls here. It owns:

- the in-memory secrets of queued and running runs (never stored);
- the dispatch loop, which places queued runs on executors (this server's
  own devices, or connected workers) using :mod:`cdui.plane.sched.queue`;
- :meth:`RunService.record_events`, the single path by which events of any run
  (local or remote) are stored, applied to the run's status and broadcast to
  live subscribers.
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import json
import logging
import re
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import Any, Protocol, cast

from aiohttp import web

from cdui.core.clock import Clock, SystemClock, wait_event
from cdui.core.config import Config
from cdui.core.diskfull import DiskFull
from cdui.core.errors import CduiError, NotFound
from cdui.core.paths import safe_join, sha256_file
from cdui.graph.presets import preset_library
from cdui.graph.secrets import MIN_SECRET_LEN, describe_path, short_secrets, split_secrets
from cdui.graph.secrets import Path_ as SecretPath
from cdui.graph.uses import presets_used
from cdui.graph.validate import Plan, validate_graph
from cdui.nodes.registry import Registry
from cdui.plane import stopping
from cdui.plane.counts import Counts
from cdui.plane.dispatch import HeldSlots, RunQueue, needs_of, reads_of
from cdui.plane.files.artifact_files import (
    KEPT_BACKENDS,
    KEPT_FOLDER,
    MAX_HASH_BYTES,
    SHA256_HEX,
    ArtifactRefused,
    FileFacts,
    KeepGate,
    KeptFiles,
    confine,
)
from cdui.plane.oneshot import OneShotBook
from cdui.plane.sched import device_fit
from cdui.plane.sched.catalog_check import any_skips
from cdui.plane.sched.free_order import FreeOrder
from cdui.plane.sched.placement import FilePlan, analyze, read_roots_message, transfer_verdict, unreadable
from cdui.plane.sched.queue import Blocked, ExecutorView, Placement, block, parse_caps, place
from cdui.plane.store import ACTIVE, TERMINAL, ListedRow, Run, RunFilter, Store
from cdui.plane.subscription import Subscription
from cdui.run import outputs, runner
from cdui.run.catalog import with_run_report
from cdui.run.devices import detect_devices
from cdui.run.spare import SparePool
from cdui.wire import devicesets
from cdui.wire.devicesets import device_kind
from cdui.wire.event import Event
from cdui.wire.job import Job, JobFiles
from cdui.wire.runopts import RunOptions, parse_run_options
from cdui.wire.target import AnyWorker, Local, Target, Worker, target_json

log = logging.getLogger(__name__)
CP = "cp"  # the source name of events born on the control plane
APPLIED = frozenset({"artifact", "execution_facts", "status"})  # event kinds that change more than the log
DISPATCH_EVERY_S = 5.0  # a dispatch pass at least this often, woken or not
PASS_PAUSE_FROM_S = 0.0005  # a pass that took longer is followed by a pause as long (see _dispatch_loop)
PASS_PAUSE_MAX_S = 0.05
PASS_BUDGET_S = 0.002  # a pass stops after this long, and the next goes on (see dispatch_once; requests wait as long)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")




@dataclass(frozen=True)
class Admitted:
    """A submission every check accepted (:meth:`RunService.admit`): what a run is stored from."""
    options: RunOptions
    plan: Plan
    files: FilePlan
    stored_graph: Any  # installed presets it uses embedded, secrets blanked
    secrets: list[tuple[SecretPath, Any]]


@dataclass(eq=False)
class SlotWaiter:
    """A cold invoke waiting for a slot of ``executor``'s ``device`` for its app version's first serving
    process (:meth:`RunService.take_app_slot`); ``since``: when it came, on the service's clock."""
    executor: str
    device: str
    since: float
    granted: asyncio.Future[None]


class RunListener(Protocol):
    """What the run service tells an executor's owner (the worker manager) and asks of it."""

    async def on_terminal(self, run_id: str, status: str) -> None:
        """A run ended (its final status is stored)."""

    async def before_dispatch(self) -> None:
        """At start, after local recovery and before the first dispatch (adoption)."""

    async def on_shutdown(self) -> None:
        """Graceful stop: stop the listener's runs and wait for their ending."""

    async def check_target(self, target: Target, graph: Any, files: FilePlan) -> None:
        """Raise :class:`CduiError` at submit if the target can never run the graph."""

    async def on_disk_recovered(self) -> None:
        """The store's disk has room again."""


class FileStore(Protocol):
    """A bucket that replaces the transfer backend (cdui/plane/files/s3_plane.py): it may change a run's job
    just before it is sent, makes the rows of its artifacts, and removes a run's objects."""

    async def prepare(self, run: Run, job: Job, executor: Executor) -> Job: ...

    async def artifact_row(self, run_id: str, kind: str, data: dict[str, Any]) -> dict[str, Any] | str | None: ...

    async def cleanup(self, run: Run, by_retention: bool) -> str | None: ...

    async def on_worker_resumed(self, run_ids: list[str]) -> None:
        """A worker reconnected and continues ``run_ids``: their bucket credentials may come from a
        control plane that is gone."""


class Executor(ExecutorView, Protocol):
    """What placement reads of an executor (name, devices, unavailable_reason, mounted), and the
    starting and stopping of runs."""

    async def start(self, run: Run, job: Job) -> None: ...

    def stop(self, run_id: str, grace: float) -> bool: ...


class ClaimsFacts(Protocol):
    """An executor whose start's change of a run's facts can be made when the run is claimed
    (cdui.plane.worker_session.RemoteExecutor)."""

    def claim_facts(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """The change, made in the claim's transaction (then :meth:`start_claimed` starts the run), or None
        (then ``start`` does it all)."""

    def local_paths(self) -> bool:
        """Whether its runs' jobs carry this machine's folders (it runs them on this machine)."""

    async def start_claimed(self, run: Run, job: Job) -> None:
        """Start ``run`` (read without its graph; ``job`` carries it) with the job built as
        :meth:`local_paths` says."""


class LocalExecutor:
    """Runs on this server's own devices, one subprocess per run."""

    name = "local"

    def __init__(self, service: RunService, devices: list[str]) -> None:
        self.service = service
        self._devices = devices
        self.handles: dict[str, runner.RunHandle] = {}

    def devices(self) -> list[str]:
        return list(self._devices)

    def unavailable_reason(self) -> str | None:
        return None

    def mounted(self) -> bool:
        return True  # this server's own data folder

    def read_roots(self) -> list[str]:
        return [str(r) for r in self.service.layout.read_roots]

    async def start(self, run: Run, job: Job) -> None:
        run_id = run.id

        async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
            if run_id in self.service.abandoned:
                return  # it already ended failed: what it says while stopping is not stored
            try:
                # The launcher's events are already in the recorders' form (numbered, redacted,
                # sized): stored as they are, as a worker's checked events are, not made into
                # ``Event`` objects and back (about 1.2 µs an event); with the run's own line of each
                # where it was kept, stored as that text instead of encoded again.
                await self.service.record_wire(run_id, "local", events, texts)
            except DiskFull as err:
                await self.service.fail_for_full_disk(run_id, err)

        log_path = self.service.config.user_data / "logs" / "runs" / f"{run_id}.log"
        job = outputs.for_this_machine(job, self.service.config.user_data, self.service.config)
        handle = await runner.launch(job, sink, log_path, spares=self.service.spares, on_texts=sink,
                                     line_texts=True)
        self.handles[run_id] = handle

        async def forget() -> None:
            await handle.wait()
            self.handles.pop(run_id, None)
            self.service.abandoned.discard(run_id)
        self.service.spawn(forget())

    def stop(self, run_id: str, grace: float) -> bool:
        h = self.handles.get(run_id)
        if h is None:
            return False
        h.stop(grace)
        return True


STOPPED_KILLED = ("the server was killed while it was stopping (`cdui stop` kills it about 2 s after asking), "
                  "before the run's ending was stored")


class RunService:
    def __init__(self, config: Config, store: Store, registry: Registry, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.stop_grace = float(config["CODEFYUI_STOP_GRACE_S"])
        self.store = store
        self.registry = registry
        self.layout = config.layout
        self.caps = parse_caps(config["CODEFYUI_RUN_QUEUE_MAX_CONCURRENT"])
        self.executors: dict[str, Executor] = {}
        # Executors named "<prefix>.<rest>", by each prefix before a dot: a one-shot credential's instances
        # are "<credential>.<instance>" (see instances_of).
        self._dotted: dict[str, set[str]] = {}
        self.secrets: dict[str, list[Any]] = {}
        self.active = HeldSlots()  # run id -> (executor, device), with the slots in use counted as they change
        # (executor, device) -> slots held by published apps' warm serving processes there (cdui/plane/apps.py):
        # a loaded process holds its slot as a run does, so runs queue for it as for another run.
        self.app_slots: dict[tuple[str, str], int] = {}
        # (executor, device) -> slots taken for serving processes about to start (take_app_slot), and the cold
        # invokes waiting for one, in arrival order: they take turns with queued runs by arrival.
        self.app_reserved: dict[tuple[str, str], int] = {}
        self.slot_waiters: list[SlotWaiter] = []
        self.subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._closed: asyncio.Task[None] | None = None
        self.listeners: list[RunListener] = []
        # Called with each batch of a run's events as stored, before what they change (a run's ending) is
        # applied: a service that follows some runs' events without reading them back (a sweep's metrics).
        self.event_taps: list[Callable[[str, Sequence[dict[str, Any]]], None]] = []
        self._sha_cache: dict[tuple[str, int, int], str] = {}
        self.stop_pending: set[str] = set()
        self.abandoned: set[str] = set()  # local runs ended for a full disk, their process still stopping
        self.storage: FileStore | None = None  # the S3 backend, when enabled
        self.oneshot = OneShotBook(self.clock, float(config["CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S"]))
        self.queue = RunQueue()  # the queued runs, in memory (cdui/plane/dispatch.py)
        self.counts = Counts()  # what GET /metrics reports that only exists as it happens (cdui/plane/counts.py)
        self._rows = EncodedRows()  # GET /api/runs's encoded runs (see list_json)
        # The executors `any` leaves out for their catalog (any_skips reads every executor): computed again
        # only when an executor comes or goes, since an executor's catalog holds for its connection.
        self._skips: dict[str, str] | None = None
        # Each executor's (device, slots) pairs, likewise: its devices hold for its connection, the caps for the server.
        self._slot_table: dict[str, tuple[Executor, list[tuple[str, int]]]] = {}
        # Which executors the next pass asks for a free slot: those free after the last pass and those a
        # run has left since (``_freed``), or every one (``_ask_all``) after any other change (see wake).
        self._ask_all = True
        self._freed: set[str] = set()
        # Counts every wake-up that says something changed (and every change of the executors): a waiting
        # reason worked out since the last such change, from the same slots, still holds (see _place_heads).
        self._changes = 0
        # The executors free after the last pass, in `any`'s order, changed one executor at a time (see dispatch_once).
        self._free = FreeOrder(self.queue.free_key)
        self.devicebook = device_fit.DeviceBook()  # memory needs and share-by-memory settings
        self.spares = SparePool(bool(config["CODEFYUI_RUN_WARM_SPARE"]))  # warm local run processes (cdui/run/spare.py)
        # The previous server was killed in the middle of its stop (plane/stopping.py): its runs end, none is adopted.
        self.killed_while_stopping = False
        # Every recorded artifact's bytes, by sha256 (cdui/plane/files/artifact_files.py). Keeping a file and adding
        # its row is one step that a delete's release never comes between (KeepGate).
        self.kept = KeptFiles(self.layout.data_dir / KEPT_FOLDER)
        self._keep_gate = KeepGate()

    def add_listener(self, listener: RunListener) -> None:
        self.listeners.append(listener)

    # -- background tasks --------------------------------------------------
    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def hold_app_slots(self, executor: str, devices: list[str]) -> None:
        """The serving processes on ``executor`` now hold one slot each on ``devices`` (one entry per process),
        instead of what they held before; a change lets the dispatcher look again."""
        old = {k: v for k, v in self.app_slots.items() if k[0] == executor}
        new: dict[tuple[str, str], int] = {}
        for d in devices:
            new[(executor, d)] = new.get((executor, d), 0) + 1
        if new == old:
            return
        for k in old:
            del self.app_slots[k]
        self.app_slots.update(new)
        self.wake(executor)

    def wants_slot(self, executor: str, device: str) -> bool:
        """Whether a run at the head of its queue lane may run on ``executor``'s ``device`` (its target and device
        allow it), or a cold invoke waits for a slot there: an idle app process holding that slot gives it back
        (cdui/plane/apps.py)."""
        return (any(w.executor == executor and device in devicesets.members(w.device) for w in self.slot_waiters)
                or self._run_wants(executor, device, None))

    def _run_wants(self, executor: str, device: str, before: float | None) -> bool:
        """Whether a run at the head of its lane (queued before ``before``, when given) may use the slot."""
        for lane in self.queue.lanes.values():
            run = lane.head()
            if run is None or (before is not None and run.created_at >= before):
                continue
            match run.target:
                case Local():
                    here = executor == "local"
                case AnyWorker():
                    here = True
                case Worker(name=name):
                    here = executor == name or executor.startswith(name + ".")
                case _:
                    here = False
            wanted = run.options.get("device")
            if here and (not isinstance(wanted, str)
                         or any(devicesets.device_matches(w, device) for w in wanted.split(","))):
                return True
        return False

    def app_holders(self, executor: str) -> list[tuple[str, str, str]]:
        """The slots warm app processes hold on ``executor``, as :meth:`runs_on` lists runs' (id, executor, device)."""
        return [("app", ex, dev) for (ex, dev), n in self.app_slots.items() if ex == executor for _ in range(n)]

    def slots_used(self) -> dict[tuple[str, str], int]:
        """Slots in use per (executor, device): runs' and warm app processes' (and those about to start)."""
        used = dict(self.active.used)  # counted as runs come and go, not again per pass (HeldSlots)
        for k, n in self.app_slots.items():
            used[k] = used.get(k, 0) + n
        for k, n in self.app_reserved.items():
            used[k] = used.get(k, 0) + n
        return used

    # -- slots for serving processes about to start ---------------------------------------
    def _app_slot_free(self, executor: str, device: str, used: dict[tuple[str, str], int]) -> bool:
        ex = self.executors.get(executor)
        if ex is None or ex.unavailable_reason():
            return False
        share = self.devicebook.setting(executor) if self.devicebook.shared else None
        return all(used.get((executor, d), 0) < self.caps.slots(executor, d)
                   or (share is not None and devicesets.shares(share, d)) for d in devicesets.members(device))

    def _reserve(self, executor: str, device: str, n: int) -> None:
        for d in devicesets.members(device):
            left = self.app_reserved.get((executor, d), 0) + n
            if left > 0:
                self.app_reserved[(executor, d)] = left
            else:
                self.app_reserved.pop((executor, d), None)

    def try_app_slot(self, executor: str, device: str) -> bool:
        """Take a slot of ``executor``'s ``device`` for a serving process about to start, if one is free now and
        neither a queued run nor a cold invoke waits for one there (an extra process of a busy version takes no
        slot from them: its invokes wait for the processes it has instead)."""
        if (self.wants_slot(executor, device)
                or not self._app_slot_free(executor, device, self.slots_used())):
            return False
        self._reserve(executor, device, 1)
        return True

    async def take_app_slot(self, executor: str, device: str, timeout: float) -> None:
        """Take a slot of ``executor``'s ``device`` for the first serving process of an app version there: at once
        when one is free and no run queued before now waits for one; else wait for one, taking turns with the
        queued runs by arrival (the dispatch pass grants it, :meth:`_grant_app_slots`). Raises TimeoutError after
        ``timeout`` s. Each slot taken is given back with :meth:`release_app_slot` once the process holds its own
        (or did not start)."""
        now = self.clock.time()
        key = (executor, device)
        if (not any((w.executor, w.device) == key for w in self.slot_waiters)
                and not self._run_wants(executor, device, now)
                and self._app_slot_free(executor, device, self.slots_used())):
            self._reserve(executor, device, 1)
            return
        w = SlotWaiter(executor, device, now, asyncio.get_running_loop().create_future())
        self.slot_waiters.append(w)
        self.wake(executor)
        try:
            await asyncio.wait_for(asyncio.shield(w.granted), timeout)
        except BaseException:
            if w in self.slot_waiters:
                self.slot_waiters.remove(w)
            if w.granted.done() and not w.granted.cancelled():
                self.release_app_slot(executor, device)  # granted just as it gave up
            else:
                w.granted.cancel()
            raise

    def release_app_slot(self, executor: str, device: str) -> None:
        self._reserve(executor, device, -1)
        self.wake(executor)

    def _grant_app_slots(self) -> None:
        """Each waiting cold invoke, oldest first, whose slot is free and wanted by no run queued before it,
        takes it."""
        used = self.slots_used()
        for w in list(self.slot_waiters):
            if w.granted.done():
                self.slot_waiters.remove(w)
            elif (self._app_slot_free(w.executor, w.device, used)
                  and not self._run_wants(w.executor, w.device, w.since)):
                self.slot_waiters.remove(w)
                self._reserve(w.executor, w.device, 1)
                devicesets.take(used, w.executor, w.device)
                w.granted.set_result(None)

    def wake(self, freed: str | None = None) -> None:
        """A run may start now: the dispatch loop makes a pass. ``freed``: the one executor a run
        has just left, and the only change; the pass then asks that executor (and those free after
        the last pass) for a free slot, not every executor. Without it, every one is asked."""
        if freed is None:
            self._ask_all = True
        else:
            self._freed.add(freed)
        self._changes += 1
        self._wake.set()

    def _slot_freed(self, run_id: str) -> str | None:
        """``run_id`` no longer holds its slot; the executor it held one on, if any."""
        held: tuple[str, str] | None = self.active.pop(run_id, None)
        if held is None:
            return None
        self._freed.add(held[0])
        return held[0]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.store.on_disk_state.append(lambda state: loop.call_soon_threadsafe(self._disk_state, state))
        devices = list(self.config["CODEFYUI_LOCAL_DEVICES"]) or await asyncio.to_thread(detect_devices)
        self.executors["local"] = LocalExecutor(self, devices)
        self._executors_changed()
        self.devicebook.load(await self.store.workers.share_settings())
        self.killed_while_stopping = stopping.take(self.config.user_data)
        await asyncio.to_thread(self.kept.sweep_temporary)
        await self._recover()
        await self.oneshot.load(self)
        for r in await asyncio.to_thread(self.store.runs_in_status_sync, {"queued"}):
            self.queue.add(r)
        for listener in self.listeners:
            await listener.before_dispatch()
        self.spawn(self._dispatch_loop())

    async def _recover(self) -> None:
        """After a restart: local runs that were executing end ``interrupted``;
        queued runs stay queued (NOTES.md); worker runs are left to adoption."""
        rows = await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE)
        why = (STOPPED_KILLED if self.killed_while_stopping
               else "the server restarted while the run was executing on it")
        for r in rows:
            if r.worker_id in (None, "local"):
                await self._finish(r.id, "interrupted", why)

    async def close(self) -> None:
        """Graceful shutdown: stop every active run, give them the shutdown grace.

        Its body runs once: a second call (the cleanup after a stop by signal)
        waits for the first one's end."""
        if self._closed is None:
            self._closed = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closed)

    async def _close(self) -> None:
        self._closing = True
        stopping.begin(self.config.user_data)
        grace = float(self.config["CODEFYUI_SHUTDOWN_GRACE_S"])
        waits: list[Awaitable[object]] = [listener.on_shutdown() for listener in self.listeners]
        local = self.executors.get("local")
        if isinstance(local, LocalExecutor):
            for h in list(local.handles.values()):
                h.stop(grace)
                waits.append(h.wait())
        all_stopped = True
        if waits:
            stopped = asyncio.ensure_future(asyncio.gather(*waits, return_exceptions=True))
            timer = asyncio.ensure_future(self.clock.sleep(grace + 15))
            either: list[asyncio.Future[Any]] = [stopped, timer]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            timer.cancel()
            if not stopped.done():
                all_stopped = False
                stopped.cancel()
                log.error("runs did not stop within the shutdown grace")
        if all_stopped:
            stopping.end(self.config.user_data)  # else the next start ends what is still active
        await self.spares.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _disk_state(self, state: dict[str, Any] | None) -> None:
        """The store's disk became full (state) or has room again (None)."""
        if state is None and not self._closing:
            self.wake()
            for listener in self.listeners:
                self.spawn(listener.on_disk_recovered())

    async def fail_for_full_disk(self, run_id: str, err: DiskFull) -> None:
        """A local run whose events cannot be stored ends ``failed`` now, saying why, and is stopped."""
        if run_id in self.abandoned:
            return
        self.abandoned.add(run_id)
        local = self.executors.get("local")
        if local is not None:
            local.stop(run_id, self.stop_grace)
        log.error("run %s: its events could not be stored (%s); ending it failed", run_id, err.message)
        try:
            await self._finish(run_id, "failed", f"{err.message}: the run's events could not be stored, so it was "
                                                 f"stopped; {err.hint}")
        except DiskFull:
            log.error("run %s: even its final status could not be stored; it ends interrupted at the next start",
                      run_id)

    # -- submit ------------------------------------------------------------
    def preset_library(self) -> dict[str, dict[str, Any]]:
        """The installed presets: CodefyUI's built-in ones shipped with cdui,
        the installed plugin packs' (``<pack>:<name>``), then the data folder's
        ``presets/*.json`` (a file there replaces a built-in of the same name)."""
        return preset_library(self.layout.folder("presets"), self.config.plugin_store)

    async def submit(self, graph: Any, options: Any) -> dict[str, Any]:
        if self.store.full:
            err = self.store.disk_full_error()
            raise CduiError("disk_full", f"run refused: {err.message}", hint=err.hint, status=507)
        a = await self.admit(graph, options)
        run_id = await self.enqueue(graph, a)
        assert run_id is not None
        return await self.get(run_id)

    async def enqueue(self, graph: Any, a: Admitted, extra: dict[str, Any] | None = None,
                      variant: tuple[str, int] | None = None) -> str | None:
        """Store and queue a run of an admitted graph; its id. ``extra``: more keys of its options (a sweep
        variant's ``sweep``); ``variant``: the sweep variant it is, claimed in the same write (None returned,
        nothing stored, when that variant is no longer waiting)."""
        now = self.clock.time()
        run_id = uuid.uuid4().hex[:12]
        opts = a.options.stored(a.files.to_json(), bool(a.secrets), self.config["CODEFYUI_GRAPH_MAX_NODES"])
        if extra:
            opts.update(extra)
        run = Run(id=run_id, name=(graph.get("name") if isinstance(graph, dict) else None),
                  status="queued", target=a.options.target, options=opts, graph=a.stored_graph,
                  created_at=now, queue_reason="waiting for the scheduler")
        if not await self.store.create_run(run, variant):
            return None
        if a.secrets:
            self.secrets[run_id] = a.secrets
        self.queue.add(run.without_graph())
        await self.record_events(run_id, CP, [self._cp_event(run_id, "status", {"status": "queued"})])
        self._wake.set()  # a new run frees no slot: the pass asks only the executors free after the last one
        return run_id

    async def admit(self, graph: Any, options: Any) -> Admitted:
        """Every check a submit makes of a graph and its options (target, device, the graph on that
        target's machine, the files it moves, its secrets), storing nothing: ``POST /api/runs`` and
        ``POST /api/graphs/validate`` both call this, so they give the same answer. Raises
        :class:`CduiError` (``invalid_graph`` with every graph error in ``details``)."""
        opts = parse_run_options(options)
        target = opts.target
        await device_fit.check_fit(target, opts.device, opts.device_set(), self.executors, self.caps,
                                   self.devicebook, self.store.workers.offered_devices)
        library = await asyncio.to_thread(self.preset_library)  # reads every preset file: off the event loop
        # A local run's machine is this one, so what its nodes need here (datasets) is checked now;
        # a worker's run subprocess checks the same on its own machine before any node runs.
        here = self.layout if isinstance(target, Local) else None
        plan, errors = await asyncio.to_thread(validate_graph, graph, self.registry, library,
                                               self.config["CODEFYUI_GRAPH_MAX_NODES"], here)
        if errors:
            raise CduiError("invalid_graph", f"the graph has {len(errors)} error(s); nothing was stored",
                            hint="fix every error listed in details and submit again", details=errors)
        assert plan is not None
        files = await asyncio.to_thread(self.file_plan, graph, library)
        await self.check_target(target, graph, files)
        await self.oneshot.refuse_record_outputs(self, target, opts.record_outputs)
        # Embed the installed presets the run uses, so it runs the same anywhere;
        # then split secrets out of the whole of it, embedded presets included.
        # An installed preset wins over an embedded one of the same name (CodefyUI's order), so
        # the embedded copy it replaces is dropped.
        used = presets_used(graph, library, self.registry.preset_params)
        extra = [p for name, p in library.items() if name in used]
        replaced = {str(p.get("preset_name") or p.get("name")) for p in extra}
        own = [p for p in graph.get("presets") or []
               if not (isinstance(p, dict) and str(p.get("preset_name") or p.get("name")) in replaced)]
        full_graph = {**graph, "presets": own + extra} if extra else graph
        stored_graph, secrets = split_secrets(full_graph, self.registry, library)
        short = short_secrets(secrets)
        if short:
            where = ", ".join(describe_path(full_graph, p) for p in short[:5])
            raise CduiError("secret_too_short", f"{len(short)} secret param value(s) are shorter than "
                            f"{MIN_SECRET_LEN} characters and could not be masked in logs and events: {where}; "
                            "nothing was stored",
                            hint=f"use the real key (at least {MIN_SECRET_LEN} characters), or leave the param empty")
        return Admitted(opts, plan, files, stored_graph, secrets)

    async def check_target(self, target: Target, graph: Any, files: FilePlan) -> None:
        """Refuse at submit what can never run (unknown worker, no way to move its files, an absolute
        path this server may not read)."""
        if isinstance(target, Local) and files.reads:
            roots = [str(r) for r in self.layout.read_roots]
            missing = unreadable(files.reads, roots)
            if missing:
                raise CduiError("path_not_readable", read_roots_message("local", missing, roots),
                                hint="add its folder to CODEFYUI_READ_ROOTS where the control plane starts "
                                     "(see docs/configuration.md), or target a worker that lists it")
        for listener in self.listeners:
            await listener.check_target(target, graph, files)

    def file_plan(self, graph: Any, library: dict[str, dict[str, Any]]) -> FilePlan:
        usage = analyze(graph, self.registry, library, self.config["CODEFYUI_GRAPH_MAX_NODES"])

        def lookup(folder: str, name: str) -> tuple[str, int] | None:
            try:
                path = self.layout.resolve_upload(folder, name)
            except CduiError:
                return None
            if not path.is_file():
                return None
            st = path.stat()
            key = (str(path), st.st_size, st.st_mtime_ns)
            if key not in self._sha_cache:
                self._sha_cache[key] = sha256_file(path)[1]
            return self._sha_cache[key], st.st_size
        # A bucket backend replaces the transfer backend, so the transfer setting alone does not decide.
        return transfer_verdict(usage, lookup, self.config["CODEFYUI_TRANSFER_ENABLED"] or self.storage is not None,
                                self.config["CODEFYUI_TRANSFER_MAX_INPUT_BYTES"])

    def _cp_event(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        # The control plane is the recorder of its own events; the store numbers them (src_seq)
        # after what it holds, in the transaction that stores them.
        return Event(kind, data, self.clock.time())

    async def record_cp(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        await self.record_events(run_id, CP, [self._cp_event(run_id, kind, data)])

    # -- events --------------------------------------------------------------
    async def record_events(self, run_id: str, src: str, events: Sequence[Event]) -> int:
        """Store, apply and broadcast events of one source. Returns the acked src_seq."""
        return await self.record_wire(run_id, src, [ev.to_wire() for ev in events])

    async def record_wire(self, run_id: str, src: str, events: list[dict[str, Any]],
                          texts: list[str | None] | None = None) -> int:
        """:meth:`record_events` of events in the recorders' form (``kind``, ``data``, ``at``, ``src_seq``),
        as an agent's ``events`` message carries them once checked: not made into ``Event`` objects and back.
        ``texts``: each event's own JSON text where its recorder's line was kept (the launcher's, or an
        agent's as its message carried it, see ``protocol.Events.texts``), stored as it is."""
        # No event is stored whole past the bound (core/event_size.py): a worker's may not have been cut
        # where born. The store measures them as it encodes them.
        limit = self.config["CODEFYUI_RUN_EVENT_MAX_BYTES"]
        if src != CP and _status_only(events):
            # A run's usual message (running, its ending, its logs): the statuses' changes of the run's row
            # are made in the transaction that stores the events, one writer round trip instead of one
            # more per status; what follows on the loop (the ending's slot, listeners, watchers) is as below.
            stored, acked, endings = await self.store.append_status_events(run_id, src, events, self.clock.time(),
                                                                            max_bytes=limit, texts=texts)
            for tap in self.event_taps:
                tap(run_id, stored)
            self.counts.events.inc(len(stored))
            if not endings and not self.subscribers.get(run_id):
                return acked  # a flood nobody watches: no event of it is made into a dict here
            ended = dict(endings)
            for i, ev in enumerate(stored):
                now_ended = ended.get(i)
                if now_ended is not None:
                    await self._ended(run_id, ev["data"]["status"], now_ended, [])
                for q in list(self.subscribers.get(run_id, ())):
                    q.put_nowait(ev)
            return acked
        # Events born here get their src_seq inside the writer's transaction (no read-then-write race).
        added, acked = await self.store.append_events(run_id, src, events, assign=(src == CP), max_bytes=limit,
                                                      texts=None if src == CP else texts)
        for tap in self.event_taps:
            tap(run_id, added)
        self.counts.events.inc(len(added))
        watchers = list(self.subscribers.get(run_id, ()))
        for ev in added:
            if ev["kind"] in APPLIED:
                await self._apply(run_id, src, ev)
                watchers = list(self.subscribers.get(run_id, ()))  # some may have come or gone meanwhile
            for q in watchers:
                q.put_nowait(ev)
        return acked

    async def _apply(self, run_id: str, src: str, ev: dict[str, Any]) -> None:
        """What an event of one of the kinds in APPLIED changes beside the log."""
        kind, data = ev["kind"], ev["data"]
        if kind == "artifact":
            await self._record_artifact(run_id, src, data)
        elif kind == "execution_facts" and src != CP:  # the run process's own fingerprint replaces the worker's
            run = await self.store.get_run(run_id)
            if run is not None:
                await self.store.set_execution_facts(run_id, with_run_report(run.execution_facts, data, src))
        elif kind == "status" and src != CP:
            status = data.get("status")
            if status == "running":
                await self.store.mark_running(run_id)
            elif status in TERMINAL:
                await self._finish(run_id, status, data.get("error"), record=False)

    async def _record_artifact(self, run_id: str, src: str, data: dict[str, Any]) -> None:
        """Turn an ``artifact`` event into an artifact row, or into an ``artifact_refused`` warning.

        A worker (``worker:<name>``) may be hostile: its events never name a path
        here directly. Its rows come from the upload route (``transfer``), from a
        ``mount`` path resolved under this server's data folder, or are display
        only (``left_on_worker``: the path is the worker's, never opened here).
        """
        backend = data.get("backend")
        if src == CP or backend == "transfer":
            return  # transfer rows are made by the upload route when the file arrives
        kind = str(data.get("kind") or "output")[:64]
        if src != "local":
            if backend == "mount":
                await self._record_mount_artifact(run_id, kind, data)
            elif backend == "s3" and self.storage is not None:
                row = await self.storage.artifact_row(run_id, kind, data)
                if isinstance(row, str):
                    await self._refuse_artifact(run_id, data.get("key"), row)
                elif row is not None:
                    await self.store.add_artifact(row)
            elif backend == "left_on_worker":
                # Shown so the user knows where the file stayed; the download route refuses it.
                await self.store.add_artifact({
                    "run_id": run_id, "kind": kind, "name": _text(data.get("name")) or "?",
                    "backend": "left_on_worker", "path": _text(data.get("path")),
                    "relative_path": _text(data.get("relative_path")), "label": None,
                    "size": _size(data.get("size")), "sha256": None})
            else:
                await self._refuse_artifact(run_id, data.get("path"), f"a worker's artifact needs backend mount, "
                                                                      f"transfer or left_on_worker, not {backend!r}")
            return
        await self._record_local_artifact(run_id, data)

    def artifact_roots(self) -> list[Path]:
        """The folders whose files may become (and be served as) artifacts: the data folders, and the
        run folders of mount runs where the data folders were moved onto a share (Layout.mount_roots)."""
        return [self.layout.data_dir, *self.layout.folders.values(),
                *(root / "runs" for root in self.layout.mount_roots()[1:])]

    async def keep_artifact(self, paths: list[Path], row: Callable[[FileFacts | None], dict[str, Any] | None],
                            expect: str | None = None, worker: bool = False) -> None:
        """Keep the bytes of the first of ``paths`` that exists (all confined already; ``expect``: only
        if they have this sha256, which a worker's row needs) and add the row ``row`` builds from what
        was found, if any."""
        async with self._keep_gate.keeping():
            facts = None
            for path in paths:
                facts = await asyncio.to_thread(self.kept.keep, path, MAX_HASH_BYTES, expect, worker)
                if facts is not None:
                    break
            made = row(facts)
            if made is not None:
                await self.store.add_artifact(made)

    async def keep_received(self, path: Path, sha: str, row: dict[str, Any] | None) -> int | None:
        """Keep a file this server received and hashed (a worker's upload), and add its row if given."""
        async with self._keep_gate.keeping():
            await asyncio.to_thread(self.kept.keep_received, path, sha)
            return None if row is None else await self.store.add_artifact(row)

    async def _release_kept(self, shas: set[str]) -> None:
        """Forget the kept bytes of ``shas`` that no remaining row names."""
        if not shas:
            return
        async with self._keep_gate.releasing():
            still = await self.store.shas_in_use(shas, KEPT_BACKENDS)
            await asyncio.to_thread(self.kept.release, shas - still)

    async def _refuse_artifact(self, run_id: str, path: Any, reason: str) -> None:
        shown = _text(path) or ""
        log.warning("run %s: artifact %r refused: %s", run_id, shown, reason)
        await self.record_cp(run_id, "run_warning", {"kind": "artifact_refused", "path": shown,
                                                     "message": f"artifact {shown!r} was not recorded: {reason}"})

    def _mount_paths(self, run_id: str, rel: str) -> list[Path]:
        """Where this server may see a mount run's file ``rel`` (relative to the worker's mount), confined.
        The run's own folder ``runs/<run id>/`` (checkpoints, TensorBoard logs) may be on a share
        beside the data folders rather than in this server's own data folder (Layout.mount_roots)."""
        try:
            parts = rel.replace("\\", "/").split("/")
            if len(parts) > 2 and parts[0] == "runs" and parts[1] == run_id:
                rest = "/".join(parts[2:])
                found = [safe_join(d, rest) for d in self.layout.mount_run_dirs(run_id)]
            else:
                found = [self.layout.resolve("data/" + rel)]
        except CduiError as exc:
            raise ArtifactRefused(rel, exc.message) from None
        return [confine(p, self.artifact_roots(), [self.config.user_data]) for p in found]

    async def _record_mount_artifact(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        rel = data.get("relative_path")
        raw_sha = data.get("sha256")
        sha = raw_sha if isinstance(raw_sha, str) and SHA256_HEX.fullmatch(raw_sha) else None

        def row(facts: FileFacts | None) -> dict[str, Any]:
            # The control plane's path only where it sees the same file (a mounted worker's shared folder):
            # else null. Its bytes are then kept here, as a local run's are.
            path = None
            if facts is not None and (facts.is_dir or not sha or facts.sha256 == sha):
                path = str(facts.path)
            return {"run_id": run_id, "kind": kind, "name": _text(data.get("name")) or Path(str(rel)).name,
                    "backend": "mount", "path": path, "relative_path": rel, "label": _text(data.get("label")),
                    "size": _size(data.get("size")), "sha256": sha}
        try:
            if not isinstance(rel, str) or not rel:
                raise ArtifactRefused(_text(rel) or "", "a mount artifact needs a relative_path")
            await self.keep_artifact(self._mount_paths(run_id, rel), row, expect=sha, worker=True)
        except ArtifactRefused as exc:
            await self._refuse_artifact(run_id, rel, exc.reason)

    async def _record_local_artifact(self, run_id: str, data: dict[str, Any]) -> None:
        raw = data.get("path")

        def row(facts: FileFacts | None) -> dict[str, Any] | None:
            if facts is None:
                return None
            try:
                rel = str(path.relative_to(self.layout.data_dir.resolve()))
            except ValueError:
                rel = None
            return {"run_id": run_id, "kind": data.get("kind", "output"), "name": _text(data.get("name")) or path.name,
                    "backend": "local", "path": str(raw), "relative_path": rel, "size": facts.size,
                    "sha256": facts.sha256}
        try:
            path = confine(str(raw or ""), self.artifact_roots(), [self.config.user_data])
            await self.keep_artifact([path], row)
        except ArtifactRefused as exc:
            await self._refuse_artifact(run_id, raw, exc.reason)

    async def _finish(self, run_id: str, status: str, error: str | None, record: bool = True) -> None:
        """End a run, once: the first ending stored wins (a later one, e.g. the status a
        run reports while being stopped after it already ended failed, changes nothing).
        ``record``: also store the final status event (from the control plane)."""
        now = self.clock.time()
        event = self._cp_event(run_id, "status", {"status": status, "error": error}) if record else None
        ended, stored = await self.store.finish_run(run_id, status, error, now, CP,
                                                    event.to_wire() if event is not None else None)
        await self._ended(run_id, status, ended, stored)

    async def _ended(self, run_id: str, status: str, ended: bool, stored: list[dict[str, Any]]) -> None:
        """What follows on the loop once a run's ending was written (``ended``: it ended now, not before;
        ``stored``: the final status event stored with it, if any): its slot, secrets and queue entry go,
        the listeners hear of it, the dispatch loop is woken."""
        for ev in stored:
            for q in list(self.subscribers.get(run_id, ())):
                q.put_nowait(ev)
        if stored:
            self.counts.events.inc(len(stored))
        if ended:
            self.counts.ended(run_id, status, self.clock.time())
        else:
            self.counts.started.pop(run_id, None)
        freed = self._slot_freed(run_id)
        self.secrets.pop(run_id, None)
        self.stop_pending.discard(run_id)
        self.queue.remove(run_id)
        if not ended:
            return
        for listener in self.listeners:
            try:
                await listener.on_terminal(run_id, status)
            except Exception:
                log.exception("terminal hook failed for run %s", run_id)
        if freed is not None:
            self.wake(freed)
        else:
            self.wake()
        if not self._closing and not self.store.full and (self.config["CODEFYUI_RUN_RETENTION_KEEP_LAST"] or 0) > 0:
            self.spawn(self._apply_retention())

    # -- the port for executors' owners (the worker manager) ---------------------
    async def finish(self, run_id: str, status: str, error: str | None) -> None:
        """End a run now (the first ending stored wins) and free its slot."""
        await self._finish(run_id, status, error)

    def adopt(self, run_id: str, executor: str, device: str, options: dict[str, Any] | None = None) -> None:
        """Count ``run_id`` as running on ``executor``/``device`` (it holds that slot, or that set;
        ``options``: the run's, for the memory it needs on a shared device)."""
        self.active[run_id] = (executor, device)
        self.devicebook.hold(run_id, options or {})

    def release(self, run_id: str) -> None:
        """Free a run's slot without ending it."""
        freed = self._slot_freed(run_id)
        if freed is not None:
            self.wake(freed)
        else:
            self.wake()

    def attach_executor(self, executor: Executor) -> None:
        """An executor came (a worker connected): the queue may place runs on it."""
        self.executors[executor.name] = executor
        for prefix in _dot_prefixes(executor.name):
            self._dotted.setdefault(prefix, set()).add(executor.name)
        self._executors_changed()
        self.wake()

    def detach_executor(self, name: str, executor: Executor | None = None) -> None:
        """The executor ``name`` is gone; with ``executor``, only if it is still that one
        (a reconnect may have attached a newer one under the same name)."""
        if executor is None or self.executors.get(name) is executor:
            self.executors.pop(name, None)
            for prefix in _dot_prefixes(name):
                names = self._dotted.get(prefix)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._dotted[prefix]
            self._free.discard(name)  # the free list holds executors that exist only
            self._executors_changed()

    def _executors_changed(self) -> None:
        self._changes += 1
        self._skips = None
        self._slot_table.clear()

    def executor(self, name: str) -> Executor | None:
        return self.executors.get(name)

    def instances_of(self, credential: str) -> list[Executor]:
        """The executors of a credential's one-shot instances (named ``<credential>.<instance>``, their
        ``credential`` that one), found without looking at every executor: an undrain of each of 500
        workers at once looked at all 500 executors twice per request."""
        out = []
        for name in sorted(self._dotted.get(credential, ())):
            ex = self.executors.get(name)
            if ex is not None and getattr(ex, "credential", None) == credential:
                out.append(ex)
        return out

    def runs_on(self, executor: str | None = None) -> list[tuple[str, str, str]]:
        """(run id, executor, device) of every run holding a slot, on ``executor`` or on any."""
        return [(rid, ex, dev) for rid, (ex, dev) in list(self.active.items())
                if executor is None or ex == executor]

    async def start_on(self, run: Run, executor: Executor, device: str) -> None:
        """Start the queued ``run`` on ``executor`` now, out of queue order (a one-shot agent's --run-id)."""
        fp = FilePlan.from_json(run.options.get("files"))
        backend = None if not fp.uses_files else ("mount" if executor.mounted() else "transfer")
        await self._start(run, Placement(executor.name, device, backend))

    async def requeue(self, run_id: str, reason: str) -> None:
        """Put a run whose assignment never reached its executor back in the queue.

        It keeps its ``created_at`` (its place in the queue) and its secrets,
        which stay in memory until the run really ends. A run whose Stop was
        asked for meanwhile ends ``cancelled`` instead: it never started."""
        self.active.pop(run_id, None)
        self.counts.started.pop(run_id, None)  # it starts again when placed again
        run = await self.store.get_run(run_id)
        if run is None or run.status in TERMINAL:
            return
        if run.stop_requested:
            await self._finish(run_id, "cancelled", f"stopped before it started ({reason})")
            return
        if await self.store.requeue(run_id, "waiting for the scheduler"):
            back = await self.store.get_run(run_id)
            if back is not None and back.status == "queued":
                self.queue.add(back)
            log.warning("run %s: %s", run_id, reason)
            await self.record_cp(run_id, "run_warning", {"kind": "requeued", "message": reason})
        self.wake()

    # -- dispatch -------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            # Woken by whatever may let a run start; every 5 s anyway (on the service's clock, so a
            # test that steps a fake clock sees the pass without waking the loop itself).
            if not await wait_event(self.clock, self._wake, DISPATCH_EVERY_S):
                self._ask_all = True  # the periodic pass asks every executor, whatever it was told
                self._changes += 1  # and works out every waiting reason again (a worker's labels may have changed)
            self._wake.clear()
            if self._closing:
                return
            if self.store.full:
                continue  # starting a run needs writes; the store wakes us when there is room again
            t0 = time.perf_counter()
            try:
                await self.dispatch_once()
            except Exception:  # one bad run must not stop the queue; it is logged and retried
                log.exception("dispatch failed")
            # Under load every ended run wakes the loop: rather than one pass (whose cost grows with the
            # executors) per wake-up, the next pass waits as long as this one took, so passes take at most
            # about half the event loop and each places the runs of every wake-up meanwhile. An idle
            # server's pass takes a fraction of a millisecond, so a submit still starts at once.
            spent = time.perf_counter() - t0
            if spent > PASS_PAUSE_FROM_S:
                await asyncio.sleep(min(spent, PASS_PAUSE_MAX_S))

    async def dispatch_once(self) -> None:
        """One pass over the queue's lanes (see cdui/plane/dispatch.py): oldest head first, each lane
        placed until its head must wait. Its cost grows with the lanes and the runs placed,
        not with the backlog. A pass that has taken PASS_BUDGET_S stops and wakes the loop for the
        next, so the event loop is never held longer than that by one."""
        if self.slot_waiters:
            self._grant_app_slots()  # before the runs queued after them
        if not self.queue.lanes:
            return
        t0 = time.perf_counter()
        used = self.slots_used()
        # The memory held on devices shared by memory: only where some device is shared (else no run's
        # placement reads it, and counting it over thousands of running runs would cost every pass).
        used_mb = self.devicebook.used_mb(self.active) if self.devicebook.shared else {}
        self.devicebook.forget_ended(self.active)
        blocked = Blocked(executors=self.executors)
        if self._skips is None:
            self._skips = any_skips(self.executors)
        skips = self._skips
        # Asking every executor costs a pass as much as hundreds of placements: unless something else changed
        # (wake without an executor), only those a run left since (or that were drained, or undrained) are
        # asked; those free after the last pass stay in the list, in its order, without being asked again
        # (with a thousand idle workers, asking each again made every pass of a submit cost milliseconds).
        # place() checks every executor it tries, so one that is no longer free is passed over, never used.
        # Each executor asked again is taken out and put back at its place (a binary search each), so a pass
        # costs the executors that changed, not the length of the list (thousands of idle workers).
        free = self._free
        if self._ask_all:
            free.reset(n for n, ex in self.executors.items() if self._has_free_slot(ex, used))
        else:
            for n in self._freed:
                free.discard(n)
                ex = self.executors.get(n)
                if ex is not None and self._has_free_slot(ex, used):
                    free.add(n)
        self._ask_all = False
        self._freed = set()
        await self._place_heads(t0, used, used_mb, blocked, skips, free)

    async def _place_heads(self, t0: float, used: dict[tuple[str, str], int], used_mb: dict[tuple[str, str], int],
                           blocked: Blocked, skips: dict[str, str], free: FreeOrder) -> None:
        heads = [(lane.head_order(), key) for key, lane in self.queue.lanes.items() if lane.runs]
        heapq.heapify(heads)
        placed = 0
        while heads:
            # Only once this pass placed a run: reading thousands of executors' slots alone can take the
            # whole budget, and a pass that always stopped before its first placement would place nothing.
            if placed and time.perf_counter() - t0 > PASS_BUDGET_S:
                self._wake.set()  # the next pass goes on from the oldest head, with the slots read afresh
                return
            _, key = heapq.heappop(heads)
            lane = self.queue.lanes.get(key)
            run = lane.head() if lane is not None else None
            if lane is None or run is None:
                continue
            if run.stop_requested or await self.oneshot.expire(self, run, self.wake):
                # Stopping, or its one-shot wait is over (expire ended it): the lane's next run is looked at.
                self.queue.remove(run.id)
                if lane.runs:
                    heapq.heappush(heads, (lane.head_order(), key))
                continue
            decision = self.place(run, used, blocked, free, used_mb, skips)
            if isinstance(decision, Placement):
                devicesets.take(used, decision.executor, decision.device)
                self.devicebook.took(used_mb, decision.executor, decision.device, devicesets.memory_need(run.options))
                self.queue.remove(run.id)
                was_free = decision.executor in free
                free.discard(decision.executor)  # from its place, before it moves to the back of the order
                self.queue.used(decision.executor)
                if was_free:
                    placed_on = self.executors.get(decision.executor)
                    if placed_on is not None and self._has_free_slot(placed_on, used):
                        free.add(decision.executor)  # least recently used is now the last
                # The slot is held from now on, and the start (its claim, a writer round trip) runs on
                # its own: the pass does not wait for one run's write before placing the next.
                self.active[run.id] = (decision.executor, decision.device)
                self.spawn(self._start(run, decision))
                placed += 1
                if lane.runs:
                    heapq.heappush(heads, (lane.head_order(), key))
            else:
                if isinstance(run.target, AnyWorker) and len(free) < len(self.executors):
                    # The refusal came from the free executors only: why over all of them is worked out
                    # when someone reads it (it reads every executor), from this pass's state. A pass
                    # whose state is the last one's, with nothing told in between (a submit behind busy
                    # workers), keeps the reason as it is, worked out once rather than at every read.
                    state = (self._changes, dict(used), set(blocked), dict(blocked.any_kinds), dict(used_mb))
                    if lane.reason_state != state:
                        lane.reason = functools.partial(self._waiting_reason, run, state[1], blocked.copy(), state[4])
                        lane.reason_state = state
                else:
                    lane.reason, lane.reason_state = decision, None
                # Later runs of its device kind do not overtake it on any executor it may use (for `any`:
                # one mark, not one per worker).
                block(blocked, run.target, device_kind(run.options.get("device")), self.executors, skips)

    def place(self, run: Run, used: dict[tuple[str, str], int], blocked: set[tuple[str, str]],
              order: Collection[str] | None, used_mb: dict[tuple[str, str], int] | None = None,
              skips: dict[str, str] | None = None) -> Placement | str:
        """Where ``run`` goes now, or why it waits: the one decision of a dispatch pass
        (``order``: the executors ``any`` tries, least recently used first; None: all)."""
        ask = self.devicebook.ask(run.options, self.executors,
                                  self.devicebook.used_mb(self.active) if used_mb is None else used_mb)
        return place(run.target, run.options.get("device"), self.executors, used, self.caps, len(self.active),
                     blocked, needs_of(run), order, ask, reads_of(run), skips)

    def _waiting_reason(self, run: Run, used: dict[tuple[str, str], int], blocked: set[tuple[str, str]],
                        used_mb: dict[tuple[str, str], int]) -> str:
        if self._skips is None:  # executors came or went since the pass
            self._skips = any_skips(self.executors)
        return str(self.place(run, used, blocked, None, used_mb, self._skips))

    def _has_free_slot(self, ex: Executor, used: dict[tuple[str, str], int]) -> bool:
        # Asked of every executor in every pass, so its (device, slots) pairs are kept (see _slot_table),
        # and the slots come first: under a backlog nearly every executor is full, the cheaper answer.
        name = ex.name
        kept = self._slot_table.get(name)
        if kept is None or kept[0] is not ex:
            kept = self._slot_table[name] = (ex, [(d, self.caps.slots(name, d)) for d in ex.devices()])
        # A device shared by memory is tried whatever its slot count: its admission is by memory.
        share = self.devicebook.setting(name) if self.devicebook.shared else None
        return any(used.get((name, d), 0) < n or (share is not None and devicesets.shares(share, d))
                   for d, n in kept[1]) and not ex.unavailable_reason()

    async def _start(self, run: Run, where: Placement) -> None:
        run_id = run.id
        if run.options.get("has_secrets") and run_id not in self.secrets:
            # Secret values live in memory only (NOTES.md); a restart while queued loses them.
            await self._finish(run_id, "failed", "the run's secret values were kept in memory only and were lost "
                                                 "when the server restarted before it started; submit it again")
            return
        # Claim it atomically: a Stop that landed since the queue was read wins. The graph is read here, once.
        # An executor that can say what its start changes in the run's facts has that made in the same
        # transaction (one writer round trip less per run); not with a storage backend, whose own facts
        # are added between the claim and the start.
        claimer = self.executors.get(where.executor)
        claim_facts = getattr(claimer, "claim_facts", None)  # a ClaimsFacts (not isinstance: it is slow per run)
        facts = claim_facts() if claim_facts is not None and self.storage is None else None
        graph = await self.store.claim_queued_graph(run_id, where.executor, where.device, self.clock.time(), facts)
        if graph is None:
            if self.active.get(run_id) == (where.executor, where.device):
                self._slot_freed(run_id)  # the slot the pass held for it
                self.wake(where.executor)
            return
        self.active[run_id] = (where.executor, where.device)
        self.counts.claimed(run_id, run.created_at, self.clock.time())
        self.devicebook.hold(run_id, run.options)
        if facts is not None:
            # Built for the claimer's machine at once (another machine's job carries none of this one's paths).
            job = self.build_job(run, where, graph, local_paths=cast(ClaimsFacts, claimer).local_paths())
        else:
            run = replace(run, graph=graph)
            job = self.build_job(run, where)
        try:
            if self.storage is not None:  # before it is sent: a run without bucket credentials fails here
                job = await self.storage.prepare(run, job, self.executors[where.executor])
            executor = self.executors[where.executor]
            if facts is not None and executor is claimer:
                await cast(ClaimsFacts, executor).start_claimed(run, job)
            else:
                await executor.start(run, job)
            if run_id in self.stop_pending:  # Stop pressed while it was being handed over
                self.executors[where.executor].stop(run_id, self.stop_grace)
        except Exception as exc:
            log.exception("could not start run %s on %s", run_id, where.executor)
            await self._finish(run_id, "failed", f"could not start the run on {where.executor}: {exc}")

    def build_job(self, run: Run, where: Placement, graph: dict[str, Any] | None = None,
                  local_paths: bool = True) -> Job:
        """The run's one job, built here once; executors and agents derive theirs from it. ``graph``: the
        run's, where ``run`` was read without it; ``local_paths``: False for another machine's job, which
        carries none of this machine's folders (what :meth:`Job.without_local_paths` makes)."""
        files = JobFiles(where.backend, tuple(FilePlan.from_json(run.options.get("files")).inputs),
                         self.config["CODEFYUI_MOUNT_LABEL"])
        graph = run.graph if graph is None else graph
        if graph is None:
            raise ValueError(f"run {run.id} was read without its graph; a job needs it")
        secrets = tuple((tuple(p), v) for p, v in self.secrets.get(run.id, []))
        if not local_paths:
            return Job(run_id=run.id, graph=graph, options=dict(run.options), slot_device=where.device, layout=None,
                       custom_nodes_dir=None, plugins_dir=None, plugin_store=None, files=files, secrets=secrets)
        return Job(run_id=run.id, graph=graph, options=dict(run.options), slot_device=where.device,
                   layout=self.layout.to_json(), custom_nodes_dir=str(self.config.custom_nodes_dir),
                   plugins_dir=str(self.config.plugins_dir), plugin_store=str(self.config.plugin_store),
                   files=files, secrets=secrets)

    # -- stop / delete --------------------------------------------------------
    async def stop(self, run_id: str) -> dict[str, Any]:
        run = await self.store.get_run(run_id)
        if run is None:
            raise NotFound("run", run_id)
        if run.status in TERMINAL:
            return await self.get(run_id)
        await self.store.request_stop(run_id)
        if run.status == "queued" and await self.store.cancel_queued(run_id):
            self.queue.remove(run_id)
            await self._finish(run_id, "cancelled", "stopped before it started")
        else:
            self.stop_pending.add(run_id)  # for an executor still setting the run up
            ex_name = (self.active.get(run_id) or (run.worker_id, None))[0]
            ex = self.executors.get(ex_name or "")
            if ex is not None:
                ex.stop(run_id, self.stop_grace)
            await self.record_cp(run_id, "log", {"message": "stop requested", "level": "info"})
        return await self.get(run_id)

    async def delete(self, run_id: str, by_retention: bool = False) -> str | None:
        """Remove a finished run, its folder and its bucket objects; a warning if the bucket was unreachable."""
        run = await self.store.get_run(run_id)
        if run is None:
            raise NotFound("run", run_id)
        if run.status not in TERMINAL:
            raise CduiError("run_active", f"run {run_id} is {run.status}; it cannot be deleted yet",
                            hint=f"stop it first: POST /api/runs/{run_id}/stop", status=409)
        kept = {a["sha256"] for a in await self.store.artifacts(run_id)
                if a["backend"] in KEPT_BACKENDS and isinstance(a["sha256"], str)}
        await asyncio.to_thread(self._remove_run_folder, run_id, run.status == "interrupted")
        await asyncio.to_thread(outputs.forget_run, outputs.store_dir(self.config.user_data), run_id)
        warning = await self.storage.cleanup(run, by_retention) if self.storage is not None else None
        await self.store.delete_run(run_id)
        await self._release_kept(kept)  # bytes another run also recorded stay kept for it
        return warning

    def _remove_run_folder(self, run_id: str, keep_checkpoints: bool) -> None:
        # Its own folder, and a mount run's on the share beside moved data folders (Layout.mount_roots).
        for folder in self.layout.mount_run_dirs(run_id):
            if not folder.is_dir() or folder.is_symlink():
                continue
            if not keep_checkpoints:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            for child in folder.iterdir():
                # The resume point: local runs write checkpoints/, transfer uploads land in checkpoint/.
                if child.name in ("checkpoints", "checkpoint"):
                    continue
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)

    async def _apply_retention(self) -> None:
        keep = self.config["CODEFYUI_RUN_RETENTION_KEEP_LAST"]
        if not keep or keep <= 0:
            return
        runs = await self.store.list_runs(limit=100000)
        finished = [r for r in runs if r.status in TERMINAL]
        for r in finished[keep:]:
            try:
                await self.delete(r.id, by_retention=True)
            except CduiError:
                pass

    # -- reading -------------------------------------------------------------
    def to_api(self, run: Run) -> dict[str, Any]:
        reason = self.queue.reason(run.id) if run.status == "queued" else None
        return api_form(run, reason, self.clock.time())

    async def get(self, run_id: str) -> dict[str, Any]:
        run = await self.store.get_run(run_id)
        if run is None:
            raise NotFound("run", run_id, hint="list runs with GET /api/runs")
        return self.to_api(run)

    async def list(self, status: str | None = None, limit: int = 200,
                   where: RunFilter | None = None) -> list[dict[str, Any]]:
        return [self.to_api(r) for r in await self.store.list_runs(status, limit, where)]

    async def set_labels(self, run_id: str, body: Any) -> dict[str, Any]:
        """``PATCH /api/runs/{id}``: replace the run's tags and/or its note (any status; nothing else
        about the run changes)."""
        tags, note, set_note = labels_from(body)
        if not await self.store.set_labels(run_id, tags, note, set_note):
            raise NotFound("run", run_id, hint="list runs with GET /api/runs")
        return await self.get(run_id)

    async def list_json(self, status: str | None = None, limit: int = 200, where: RunFilter | None = None) -> bytes:
        """``GET /api/runs``'s body: what :meth:`list` answers, as JSON (byte for byte what
        ``json.dumps`` makes of it). Built off the event loop from each run's encoded form, kept while
        the run's row (and its queue reason) is unchanged: a listing of 200 runs is about 134 KB, which
        took the event loop tens of milliseconds to build and encode under a dispatch backlog. Read and
        encoded in one hop to a thread: under a backlog each return to the busy event loop waits behind
        what it has to do, and a read, then an encoding, waited twice."""
        # What only the event loop may work out: each lane's waiting reason (from the dispatch state). The
        # thread finds a listed run's lane itself (RunQueue.lane_key).
        reasons = self.queue.lane_reasons()
        now = self.clock.time()

        def listing() -> bytes:
            rows = self.store.list_rows_sync(status, limit, where)
            of = {r.id: reasons.get(self.queue.lane_key(r.id) or "") for r in rows if r.status == "queued"}
            return self._rows.encode(rows, of, now)
        return await asyncio.to_thread(listing)

    def subscribe(self, run_id: str) -> Subscription:
        q = Subscription()  # bounded: a slow watcher reads what it missed from the store
        self.subscribers.setdefault(run_id, set()).add(q)
        return q

    def unsubscribe(self, run_id: str, q: asyncio.Queue[dict[str, Any]]) -> None:
        s = self.subscribers.get(run_id)
        if s:
            s.discard(q)
            if not s:
                self.subscribers.pop(run_id, None)


def _dot_prefixes(name: str) -> list[str]:
    """Each part of ``name`` before one of its dots ("a.b.c": "a", "a.b")."""
    return [name[:i] for i, ch in enumerate(name) if ch == "."]


def api_form(run: Run, queue_reason: str | None, now: float) -> dict[str, Any]:
    """A run as the API shows it (``queue_reason``: the queue's own, for a queued run; ``now``: for how
    long a disconnected run's worker has been away)."""
    out = {
        "id": run.id, "name": run.name, "status": run.status, "target": target_json(run.target),
        "device": run.slot_device, "options": run.options,
        "worker_id": run.worker_id, "worker_status": None,
        "queue_reason": (queue_reason or run.queue_reason) if run.status == "queued" else None,
        "error": run.error, "late_result": run.late_result,
        "execution_facts": run.execution_facts or {},
        "stop_requested": bool(run.stop_requested),
        "last_seq": run.last_seq,
        "created_at": iso(run.created_at), "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "tags": list(run.tags), "note": run.note,
    }
    if run.options.get("canvas"):
        out["canvas"] = run.options["canvas"]  # a canvas Run's tab (cdui/plane/canvas.py)
    if run.options.get("sweep"):
        out["sweep"] = run.options["sweep"]  # a sweep variant's sweep id, index and params (cdui/plane/sweeps.py)
    if run.disconnected_at and run.status == "disconnected":
        since = now - run.disconnected_at
        out["worker_status"] = {"state": "disconnected", "since": iso(run.disconnected_at),
                                "disconnected_s": round(since, 1),
                                "text": f"worker disconnected {since:.0f} s ago"}
    return out


TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+/-]{0,63}")
MAX_TAGS = 32         # tags on one run
MAX_NOTE = 10_000     # characters of a run's note


def check_tag(tag: Any, where: str = "tag") -> str:
    """A tag as stored (1-64 of letters, digits and ``_.:+/-``, starting with a letter or digit), or a
    ``400 bad_tag`` naming it."""
    if not isinstance(tag, str) or not TAG.fullmatch(tag):
        shown = repr(tag)[:80]
        raise CduiError("bad_tag", f"{where} {shown} is not valid: a tag is 1 to 64 letters, digits or _ . : + / -, "
                                   f"starting with a letter or digit", hint='e.g. "lr-sweep" or "baseline:v2"')
    return tag


def labels_from(body: Any) -> tuple[list[str] | None, str | None, bool]:
    """(tags or None, note, whether the note is given) from a ``PATCH /api/runs/{id}`` body."""
    if not isinstance(body, dict) or not body or set(body) - {"tags", "note"}:
        extra = sorted(set(body) - {"tags", "note"}) if isinstance(body, dict) else None
        raise CduiError("bad_request", "the body is an object with \"tags\" (a list of tags), \"note\" (text or "
                                       "null) or both" + (f"; unknown keys: {', '.join(map(repr, extra))}"
                                                          if extra else ""),
                        hint='e.g. {"tags": ["baseline"], "note": "lr 0.01, 400 epochs"}')
    tags = None
    if "tags" in body:
        raw = body["tags"]
        if not isinstance(raw, list):
            raise CduiError("bad_tag", f"\"tags\" is a list of tags, not {type(raw).__name__}",
                            hint='e.g. {"tags": ["baseline"]}; [] removes every tag')
        if len(raw) > MAX_TAGS:
            raise CduiError("too_many_tags", f"{len(raw)} tags given; a run holds at most {MAX_TAGS}")
        tags = list(dict.fromkeys(check_tag(t) for t in raw))  # repeated ones once, in their order
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise CduiError("bad_request", f"\"note\" is text or null, not {type(note).__name__}")
    if note is not None and len(note) > MAX_NOTE:
        raise CduiError("note_too_long", f"the note is {len(note):,} characters; at most {MAX_NOTE:,}",
                        hint="keep longer text in a file and name it in the note")
    return tags, (note or None), "note" in body


class EncodedRows:
    """Each listed run's API form, encoded, kept while its row and queue reason stay the same.

    A run's form depends on its row, its queue reason (queued runs) and the time (a disconnected run's
    ``worker_status``): a row read again equal to the kept one (compared as read, see
    :class:`~cdui.plane.store.database.ListedRow`), with the same reason, reuses the kept bytes without
    being decoded; a disconnected run is encoded every time. At most ``keep`` runs are kept (the oldest
    listed go first). Used from a worker thread, one listing at a time or several: a lost race encodes
    a run twice, never a wrong one."""

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._kept: dict[str, tuple[ListedRow, str | None, bytes]] = {}

    def encode(self, rows: Sequence[ListedRow], reasons: dict[str, str | None], now: float) -> bytes:
        """The JSON array of ``rows``' API forms (``reasons``: the queue's reason of each queued run, by id)."""
        parts: list[bytes] = []
        kept = self._kept
        for row in rows:
            run_id = row.id
            reason = reasons.get(run_id)
            old = kept.get(run_id)
            if old is not None and old[1] == reason and old[0] == row:
                parts.append(old[2])
                continue
            run = row.run()
            data = json.dumps(api_form(run, reason, now)).encode()
            if run.status != "disconnected":
                kept.pop(run_id, None)
                kept[run_id] = (row, reason, data)
            parts.append(data)
        while len(kept) > self.keep:
            kept.pop(next(iter(kept)), None)
        return b"[" + b", ".join(parts) + b"]"


# The run service in the control plane's app (cdui.plane.server.build_app makes it).
RUNS: web.AppKey[RunService] = web.AppKey("runs")


def _status_only(events: list[dict[str, Any]]) -> bool:
    """Whether of the events' kinds that change more than the log (APPLIED) there are statuses only, each
    with an error that is text or null (as a run's own ending has): such a message is stored with its
    statuses' changes of the run's row in one transaction (RunService.record_wire)."""
    applied = APPLIED.intersection(map(dict.get, events, repeat("kind")))
    if not applied:
        return True  # the usual message of a flood: its kinds taken in one pass, none of them applied
    if applied != {"status"}:
        return False
    for e in events:
        kind = e.get("kind")
        if kind == "status":
            data = e.get("data")
            if not isinstance(data, dict) or not isinstance(data.get("error"), (str, type(None))):
                return False
        elif kind in APPLIED:
            return False
    return True


def _text(v: Any, limit: int = 4096) -> str | None:
    """A display string from an event field (bounded; None stays None)."""
    if v is None:
        return None
    return str(v)[:limit]


def _size(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
